package control

import (
	"bytes"
	"context"
	"errors"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
)

// File operations (List, Stat, Remove, Mkdir, Rename) go the way files do
// (files.go): each is one command of an exec session the way in admitted,
// a fixed sh script with the paths as its arguments, with the same exit
// statuses (exitNotFound, exitConflict, 127 for a missing utility) and
// exitNotEmpty.
//
// What a file is comes from stat -c, which busybox and GNU coreutils both
// have: "%f %s %Y %n", the raw mode in hex, the size, the modification
// time in seconds since the epoch and the name, as lstat sees it. A name
// may hold any byte but NUL and '/', a newline too, so a listing never
// splits stat's lines: the script first prints the names it found, each
// ended by a NUL, and the parser matches each of stat's records to the
// name it expects (parseRecord). A name that cannot hold '/' cannot pass
// for the script's own records either, which start with '/'.

// exitNotEmpty: the directory to remove, or to rename over, is not empty.
const exitNotEmpty = 95

// statFormat is the stat -c format of a record: "MODE SIZE MTIME NAME\n".
const statFormat = `'%f %s %Y %n'`

// need exits 127 when the image lacks one of the utilities named, or has
// a stat that does not take -c FORMAT (a busybox built without it), which
// would leave every record out and a directory looking empty.
const needFunc = `need() {
  for c; do command -v "$c" >/dev/null 2>&1 || { echo "the image has no $c" >&2; exit 127; }; done
  case " $* " in *" stat "*) stat -c %f / >/dev/null 2>&1 || { echo "the image's stat does not take -c FORMAT" >&2; exit 127; };; esac
}
`

// listScript lists the directory $1, at most $2 entries: its names, in
// chunks of 256 (well within any exec's argument limit), each chunk being
// the chunk's names each ended by a NUL, an empty name (a NUL), stat's
// records of those names and a NUL. Stat's records pass through a command
// substitution, which drops NULs (dash, bash and busybox's ash alike), so
// a stat that prints the framing itself cannot end the records early and
// frame names of its own; the "." keeps trailing newlines, and head
// bounds what the shell holds of a stat that never stops to $3 bytes
// (maxListOutput: more is cut anyway). Past $2 entries it prints
// "/truncated" and a NUL and stops. The globs find every name but . and
// ..; a glob that matches nothing stays itself, which -e and -L then skip.
// A symbolic link to a directory lists the directory.
const listScript = needFunc + `need stat head
[ -e "$1" ] || [ -L "$1" ] || exit 92
[ -d "$1" ] || { echo "$1 is not a directory" >&2; exit 93; }
{ [ -r "$1" ] && [ -x "$1" ]; } || { echo "$1: permission denied" >&2; exit 94; }
cd "$1" || exit 94
max=$2 cap=$3
emit() {
  [ $# -gt 0 ] || return 0
  printf '%s\0' "$@"; printf '\0'
  r=$(stat -c ` + statFormat + ` -- "$@" | head -c "$cap"; echo .)
  printf '%s\0' "${r%.}"
}
n=0 total=0
set --
for f in * .[!.]* ..?*; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  total=$((total+1))
  if [ $total -gt $max ]; then emit "$@"; printf '/truncated\0'; exit 0; fi
  set -- "$@" "$f"
  n=$((n+1))
  [ $n -lt 256 ] || { emit "$@"; set --; n=0; }
done
emit "$@"`

// statScript prints the record of $1.
const statScript = needFunc + `need stat
[ -e "$1" ] || [ -L "$1" ] || exit 92
exec stat -c ` + statFormat + ` -- "$1"`

// removeScript removes $1: a file or a symbolic link (never what it points
// to), an empty directory, or with $2 = 1 a directory and all it holds.
// A directory that is not empty without $2 = 1 exits 95.
const removeScript = needFunc + `need rm rmdir
[ -e "$1" ] || [ -L "$1" ] || exit 92
if [ -d "$1" ] && [ ! -L "$1" ]; then
  [ "$2" = 1 ] && exec rm -rf -- "$1"
  for f in "$1"/* "$1"/.[!.]* "$1"/..?*; do
    if [ -e "$f" ] || [ -L "$f" ]; then echo "$1 is a directory that is not empty" >&2; exit 95; fi
  done
  exec rmdir -- "$1"
fi
exec rm -f -- "$1"`

// parentsFunc defines parents, which makes the directory $1 and those
// above it that are missing, and exits 93 when the nearest one that
// exists is not a directory (nor a link to one).
const parentsFunc = `parents() {
  p=$1
  while [ "$p" != / ] && [ ! -e "$p" ] && [ ! -L "$p" ]; do p=${p%/*}; p=${p:-/}; done
  [ -d "$p" ] || { echo "$p is not a directory" >&2; exit 93; }
  [ "$p" = "$1" ] || mkdir -p -- "$1" || exit 94
}
`

// mkdirScript makes the directory $1 and its missing parents, and prints
// its record; one that exists already is no error.
const mkdirScript = needFunc + parentsFunc + `need stat mkdir
parents "$1"
exec stat -c ` + statFormat + ` -- "$1"`

// renameScript renames $1 to $2, making $2's missing parents, and prints
// $2's record. A $2 that is $1 itself, spelled otherwise (through a
// symbolic link above it, or a hard link), is left as it is, as rename(2)
// does: replacing it would first remove the very file to rename. A $2 that exists exits 93 unless $3 = 1; then a file or a
// link there is replaced (a link, never what it points to), and an empty
// directory is when $1 is a directory too. A directory that is not empty
// exits 95.
const renameScript = needFunc + parentsFunc + `need stat mkdir mv rm rmdir
[ -e "$1" ] || [ -L "$1" ] || exit 92
same() { [ "$1" = "$2" ] || { [ ! -L "$1" ] && [ ! -L "$2" ] && [ "$1" -ef "$2" ]; }; }
if ! same "$1" "$2"; then
  d=${2%/*}
  parents "${d:-/}"
  if [ -e "$2" ] || [ -L "$2" ]; then
    [ "$3" = 1 ] || { echo "$2 exists" >&2; exit 93; }
    if [ -L "$2" ]; then
      rm -f -- "$2" || exit 94
    elif [ -d "$2" ]; then
      { [ -d "$1" ] && [ ! -L "$1" ]; } || { echo "$2 is a directory" >&2; exit 93; }
      rmdir -- "$2" 2>/dev/null || { echo "$2 is a directory that is not empty" >&2; exit 95; }
    elif [ -d "$1" ] && [ ! -L "$1" ]; then
      echo "$2 is not a directory" >&2; exit 93
    fi
  fi
  mv -f -- "$1" "$2" || exit 94
fi
exec stat -c ` + statFormat + ` -- "$2"`

// FSTimeout bounds one file operation: a recursive remove of a large tree
// is the longest of them.
const FSTimeout = api.FSTimeout

// maxListOutput caps what of a listing's output is read: 10,001 names of
// 255 bytes, each twice, with their records, fit with room to spare. Past
// it the command is ended and the listing is Truncated.
const maxListOutput = 8 << 20

// maxRecordOutput caps what of a single record's output is read.
const maxRecordOutput = 64 << 10

// ErrNotEmpty: a directory to remove without recursion, or to rename
// over, holds something.
var ErrNotEmpty = errors.New("the directory in the sandbox is not empty")

// ErrUnreadable: the sandbox answered what is not a stat record of the
// path, as a stat on its PATH that is not stat would.
var ErrUnreadable = errors.New("the sandbox's answer is not a stat record of the path")

// FileType is what kind of file an entry is.
type FileType string

const (
	TypeFile    FileType = "file"
	TypeDir     FileType = "dir"
	TypeSymlink FileType = "symlink"
	TypeOther   FileType = "other"
)

// FileStat is what the sandbox says of one file (its lstat: a symbolic
// link is itself). Mode holds the permission bits (with setuid, setgid and
// sticky), never the type.
type FileStat struct {
	Name  string
	Type  FileType
	Size  int64
	Mode  uint32
	MTime time.Time
}

// Listing is a directory's entries, sorted by name, at most
// api.MaxListEntries; Truncated says there were more (or more output than is
// read).
type Listing struct {
	Entries   []FileStat
	Truncated bool
}

// pathRefused is a path no file operation takes, as ValidatePath's errors
// are: a *FieldError of ErrInvalidPath naming the request field.
func pathRefused(field, problem string) error {
	return &FieldError{Field: field, Message: problem, Err: ErrInvalidPath}
}

// CheckRemove holds the path of a remove to what Remove takes: a path
// ValidatePath takes, other than /. The API checks it before admission too,
// to answer 400 with nothing run.
func CheckRemove(p string) error {
	if err := ValidatePath("path", p); err != nil {
		return err
	}
	if p == "/" {
		return pathRefused("path", "/ cannot be removed")
	}
	return nil
}

// CheckRename holds a rename to what Rename takes: paths ValidatePath takes,
// neither of them /, to not inside from.
func CheckRename(from, to string) error {
	if err := ValidatePath("from", from); err != nil {
		return err
	}
	if err := ValidatePath("to", to); err != nil {
		return err
	}
	switch {
	case from == "/":
		return pathRefused("from", "/ cannot be renamed")
	case to == "/":
		return pathRefused("to", "/ cannot be replaced")
	case strings.HasPrefix(to, from+"/"):
		return pathRefused("to", "is inside from: a directory cannot move into itself")
	}
	return nil
}

// List lists the directory dir (or the one a symbolic link dir points to)
// of the session's sandbox. It answers a *FieldError of ErrInvalidPath, a *FileError
// (ErrFileNotFound, ErrPathConflict for a file that is not a directory),
// or an error of Exec.
func (s *Session) List(ctx context.Context, dir string) (Listing, error) {
	if err := ValidatePath("path", dir); err != nil {
		return Listing{}, err
	}
	out, cut, err := s.runFS(ctx, maxListOutput, listScript, dir, strconv.Itoa(api.MaxListEntries), strconv.Itoa(maxListOutput))
	if err != nil {
		return Listing{}, err
	}
	l := parseListing(out, api.MaxListEntries)
	l.Truncated = l.Truncated || cut
	return l, nil
}

// Stat answers what the file p of the session's sandbox is, or an error as
// List does.
func (s *Session) Stat(ctx context.Context, p string) (FileStat, error) {
	if err := ValidatePath("path", p); err != nil {
		return FileStat{}, err
	}
	return s.record(ctx, p, statScript, p)
}

// Remove removes the file, symbolic link or empty directory p of the
// session's sandbox, and with recursive a directory and everything in it.
// A directory that is not empty without recursive is a *FileError of
// ErrNotEmpty; / is a *FieldError of ErrInvalidPath.
func (s *Session) Remove(ctx context.Context, p string, recursive bool) error {
	if err := CheckRemove(p); err != nil {
		return err
	}
	r := "0"
	if recursive {
		r = "1"
	}
	_, _, err := s.runFS(ctx, maxRecordOutput, removeScript, p, r)
	return err
}

// Mkdir makes the directory p of the session's sandbox and any missing
// parents, and answers what p is then. One that exists is no error; a file
// in the way is a *FileError of ErrPathConflict.
func (s *Session) Mkdir(ctx context.Context, p string) (FileStat, error) {
	if err := ValidatePath("path", p); err != nil {
		return FileStat{}, err
	}
	return s.record(ctx, p, mkdirScript, p)
}

// Rename renames from to to in the session's sandbox, making to's missing
// parents, and answers what to is then. A to that exists is a *FileError
// of ErrPathConflict unless overwrite, which replaces a file or a link, or
// an empty directory with a directory (ErrNotEmpty for one that is not).
func (s *Session) Rename(ctx context.Context, from, to string, overwrite bool) (FileStat, error) {
	if err := CheckRename(from, to); err != nil {
		return FileStat{}, err
	}
	o := "0"
	if overwrite {
		o = "1"
	}
	return s.record(ctx, to, renameScript, from, to, o)
}

// record runs script with args and parses its output as the record of p.
func (s *Session) record(ctx context.Context, p, script string, args ...string) (FileStat, error) {
	out, _, err := s.runFS(ctx, maxRecordOutput, script, args...)
	if err != nil {
		return FileStat{}, err
	}
	fs, n, ok := parseRecord(out, p)
	if !ok || n != len(out) {
		return FileStat{}, &FileError{Kind: ErrUnreadable}
	}
	fs.Name = path.Base(p)
	return fs, nil
}

// runFS runs one file operation's script with args, within FSTimeout, and
// returns at most max bytes of its output; cut says there was more, and
// the command was ended there. Its errors are those of the transfers
// (fileExitError, fileExecFailed) with ErrNotEmpty for exitNotEmpty.
func (s *Session) runFS(ctx context.Context, max int, script string, args ...string) (out []byte, cut bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, FSTimeout)
	defer cancel()
	stdout := &cutWriter{max: max, cut: cancel}
	stderr := &capWriter{max: maxFileStderr}
	argv := append([]string{"sh", "-c", script, "sh"}, args...)
	st, err := s.Exec(ctx, cluster.ExecRequest{Command: argv, Stdout: s.Out(stdout), Stderr: stderr})
	switch {
	case stdout.over:
		// The command was ended for its output: what was read stands.
		return stdout.buf, true, nil
	case err != nil:
		return nil, false, fileExecFailed(err)
	case st.Code == exitNotEmpty:
		return nil, false, &FileError{Kind: ErrNotEmpty, Code: st.Code, Stderr: strings.TrimSpace(api.Printable(string(stderr.buf)))}
	case st.Code != 0:
		return nil, false, fileExitError(st.Code, stderr.buf)
	}
	return stdout.buf, false, nil
}

// cutWriter keeps the first max bytes, and ends the command (cut) at the
// first byte past them.
type cutWriter struct {
	max  int
	buf  []byte
	over bool
	cut  context.CancelFunc
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if c.over {
		return 0, errAnswered
	}
	if room := c.max - len(c.buf); len(p) > room {
		c.buf = append(c.buf, p[:room]...)
		c.over = true
		c.cut()
		return room, errAnswered
	}
	c.buf = append(c.buf, p...)
	return len(p), nil
}

// maxName bounds a name in a listing: no file system has longer ones.
const maxName = 4096

// maxChunk bounds the names of one chunk of a listing, of which
// listScript prints 256.
const maxChunk = 1024

// parseListing parses listScript's output, keeping at most max entries.
// The output is hostile: a record that does not match the name it should
// be of is dropped (the file went away between the glob and stat, or stat
// is not stat), as is a name that cannot be one, and output that breaks
// the framing ends the listing there, Truncated.
func parseListing(out []byte, max int) Listing {
	var l Listing
	seen := map[string]bool{}
	for len(out) > 0 {
		rec, rest, ok := cutNUL(out)
		if !ok || rec == "" {
			l.Truncated = true
			break
		}
		if rec == "/truncated" {
			l.Truncated = true
			break
		}
		var names []string
		for ok && rec != "" && len(names) < maxChunk {
			names = append(names, rec)
			rec, rest, ok = cutNUL(rest)
		}
		blob, after, found := bytes.Cut(rest, []byte{0})
		if !ok || rec != "" || !found {
			l.Truncated = true
			break
		}
		out = after
		for _, name := range names {
			fs, n, ok := parseRecord(blob, name)
			if !ok {
				continue
			}
			blob = blob[n:]
			if !validName(name) || seen[name] {
				continue
			}
			if len(l.Entries) == max {
				l.Truncated = true
				break
			}
			seen[name] = true
			fs.Name = name
			l.Entries = append(l.Entries, fs)
		}
	}
	slices.SortFunc(l.Entries, func(a, b FileStat) int { return strings.Compare(a.Name, b.Name) })
	return l
}

// cutNUL cuts the record before the first NUL of b, if there is one
// within maxName bytes.
func cutNUL(b []byte) (rec string, rest []byte, ok bool) {
	i := bytes.IndexByte(b[:min(len(b), maxName+1)], 0)
	if i < 0 {
		return "", nil, false
	}
	return string(b[:i]), b[i+1:], true
}

// validName reports whether name can be a directory's entry.
func validName(name string) bool {
	return name != "" && name != "." && name != ".." && len(name) <= maxName && !strings.ContainsAny(name, "/\x00")
}

// The times an entry may have: what RFC 3339 can write.
var (
	minMTime = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	maxMTime = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
)

// parseRecord parses the stat record at the start of b, which must be of
// name: "MODE SIZE MTIME NAME\n", MODE in hex. It answers the record's
// entry (without its name) and its length.
func parseRecord(b []byte, name string) (FileStat, int, bool) {
	var f [3]string
	rest := b
	for i := range f {
		sp := bytes.IndexByte(rest[:min(len(rest), 21)], ' ')
		if sp <= 0 {
			return FileStat{}, 0, false
		}
		f[i], rest = string(rest[:sp]), rest[sp+1:]
	}
	if len(rest) < len(name)+1 || string(rest[:len(name)]) != name || rest[len(name)] != '\n' {
		return FileStat{}, 0, false
	}
	mode, err := strconv.ParseUint(f[0], 16, 32)
	if err != nil {
		return FileStat{}, 0, false
	}
	size, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || size < 0 || f[1][0] == '+' {
		return FileStat{}, 0, false
	}
	secs, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil || f[2][0] == '+' {
		return FileStat{}, 0, false
	}
	mtime := minMTime
	if secs > minMTime.Unix() {
		mtime = time.Unix(min(secs, maxMTime.Unix()), 0).UTC()
	}
	fs := FileStat{Type: fileType(uint32(mode)), Size: size, Mode: uint32(mode) & 0o7777, MTime: mtime}
	return fs, len(b) - len(rest) + len(name) + 1, true
}

// fileType is the type of a raw st_mode.
func fileType(mode uint32) FileType {
	switch mode & 0o170000 {
	case 0o100000:
		return TypeFile
	case 0o040000:
		return TypeDir
	case 0o120000:
		return TypeSymlink
	}
	return TypeOther
}
