package control

// The scripts of background processes. Like the file scripts, each is
// fixed text run by sh, and everything of the caller's (the command line,
// the signal, sizes, offsets) reaches it only as arguments; a process id
// is hiloop's own (store.NewID). A process keeps its state in the sandbox
// under procRoot/<id>/:
//
//	sup       the supervisor's pid
//	pid       the command's pid, which is also its process group and session
//	keeper    the pid of the process that holds stdin open (closing stdin kills it)
//	in        a FIFO, the command's stdin
//	o         a FIFO, the command's stdout and stderr, read by the chunker
//	out.N     the output from byte N on (N zero-padded to 16 digits), procChunk
//	          bytes and at most one dd's worth (256 KiB) more; only the newest
//	          procChunks are kept
//	exit      the command's exit status, once it exited
//	done      once all its output is in the chunks
//	r.TOKEN   the pid of a reader of the output (outputScript)
//
// The command runs in a session of its own (setsid), under a supervisor
// in another session that outlives the exec that started it: a signal goes
// to the command's whole process group, never to the supervisor, which
// waits for the command, writes its exit status, and then kills what is
// left of its group, so that the output ends with it.

// procRoot is where processes keep their state in the sandbox.
const procRoot = "/tmp/.hiloop/proc"

// The output is kept in chunks of about procChunk bytes, the newest
// procChunks of them: a process's output costs its sandbox at most that
// much (and a quarter MiB a chunk), at least the newest (procChunks-1) *
// procChunk bytes are kept, and a reader that falls further behind finds
// its offset gone. The scripts spell them out (M and K); a test holds the
// two to each other.
const (
	procChunk  = 1 << 20
	procChunks = 5
)

// Exit statuses of the process scripts, beside 127 for a missing utility.
const (
	exitProcMissing    = 92 // the process's state in the sandbox is gone
	exitProcExists     = 93 // a start found the id's directory already there
	exitProcFailed     = 94 // a command the script ran failed
	exitProcNoStart    = 95 // the supervisor did not say it started the command
	exitOutputGone     = 96 // the offset is older than the output kept
	exitProcNotRunning = 97 // the process exited
	// A start whose command's set-up failed exits with setupScript's
	// status less procSetupShift: 84 to 87.
	procSetupShift = 8
)

// procFuncs are the shell functions the scripts share: size prints a
// file's size (see sizeFunc), chunk the path of the chunk that starts at
// byte $1, num strips a chunk name's zero padding (sh would read a
// leading zero as octal), sig sends signal $1 to process group $2 (busybox
// and dash differ on "--"), and lost reports whether the supervisor of the
// process in $d is gone without having written an exit status (killed by
// something in the sandbox): such a process is never reported running,
// and lost kills what is left of it (reap), its command's group and the
// holder of its stdin, since nothing can signal it through hiloop once it
// is recorded ended. pidf prints the pid in the file $1 of $d, and fails
// unless it is a pid above 1: the files are the sandbox's to write, and a
// signal to -1 or to group 1 would reach every process of the sandbox.
const procFuncs = sizeFunc + `chunk() { printf '%s/out.%016d' "$d" "$1"; }
num() { x=${1##*/out.}; x=${x#"${x%%[!0]*}"}; echo "${x:-0}"; }
sig() { kill -s "$1" "-$2" 2>/dev/null || kill -s "$1" -- "-$2"; }
pidf() { v=$(cat "$d/$1" 2>/dev/null) || return 1; case $v in ''|*[!0-9]*|0|1) return 1;; esac; echo "$v"; }
reap() {
  for rf in pid keeper; do
    rx=$(pidf $rf) || continue
    if [ $rf = pid ]; then sig KILL "$rx"; else kill -s KILL "$rx"; fi
  done 2>/dev/null
  return 0
}
lost() { [ ! -e "$d/exit" ] && sp=$(cat "$d/sup" 2>/dev/null) && ! kill -s 0 "$sp" 2>/dev/null && [ ! -e "$d/exit" ] && reap; }
`

// supervisorScript runs a command with its state in the directory $1; the
// rest of its arguments are the command's working directory ("" for the
// image's), its NAME=VALUE variables, "--", and the command line. The
// command is started by a short script ($r) that runs in the new session
// and then becomes the command (exec): it writes the pid only once the
// session exists, so a signal sent as soon as the start answered reaches
// the command's group; then it enters the directory and exports the
// variables (as setupScript does for an exec: `command export`, so a
// refused variable fails rather than ending the shell), and tells the
// start script the pid through the FIFO $1/ready, which it opens
// read-write so that it never waits for a reader that is gone. A set-up
// that failed says "setup N" there instead (N as setupScript's exit
// statuses), writes what sh said of a refused variable to $1/setup, and
// exits N: the command never runs. Once the caller's variables are set,
// the script uses only builtins and variables of the reserved prefix, so
// no PATH or name of the caller's changes what it does.
// The chunker copies the output FIFO into chunks with dd, which writes
// each read as it comes, so a reader sees output at once (GNU head -c
// would hold it in its stdio buffer), and starts the next chunk once one
// passed M bytes: chunks are named by the offset they start at.
const supervisorScript = procFuncs + `d=$1; shift
r='HILOOP_D=$1; shift; echo $$ >"$HILOOP_D/pid.t" && mv "$HILOOP_D/pid.t" "$HILOOP_D/pid" || exit 1
HILOOP_F() { echo "setup $1" 1<>"$HILOOP_D/ready"; exit "$1"; }
[ -z "$1" ] || cd "$1" 2>/dev/null || { [ -e "$1" ] || HILOOP_F 92; [ -d "$1" ] || HILOOP_F 93; HILOOP_F 94; }
shift
for HILOOP_A in "$@"; do
  shift
  [ "$HILOOP_A" = -- ] && break
  command export "$HILOOP_A" 2>"$HILOOP_D/setup" || HILOOP_F 95
done
echo $$ 1<>"$HILOOP_D/ready" && exec "$@"'
M=1048576
K=5
chunks() {
  o=0
  while :; do
    f=$(chunk $o) && : >"$f" || return
    set -- "$d"/out.*
    [ $# -gt $K ] && rm -f "$1"
    n=0
    while [ "$n" -lt $M ]; do
      dd bs=16384 count=16 2>/dev/null >>"$f" || return
      m=$(size "$f") || return
      [ "$m" -eq "$n" ] && return
      n=$m
    done
    o=$((o+n))
  done
}
echo $$ >"$d/sup"
if ! mkfifo "$d/in" "$d/o"; then echo fail 1<>"$d/ready"; exit 1; fi
chunks <"$d/o" &
c=$!
sleep 2147483647 >"$d/in" &
k=$!
echo $k >"$d/keeper"
setsid sh -c "$r" sh "$d" "$@" <"$d/in" >"$d/o" 2>&1 &
p=$!
wait $p
e=$?
echo $e >"$d/exit.t" && mv "$d/exit.t" "$d/exit"
sig KILL $p 2>/dev/null
kill $k 2>/dev/null
wait $c
: >"$d/done"
rm -f "$d/in" "$d/o" "$d/ready"`

// startScript starts a process: $1 is the supervisor's script, $2 the
// process's id, $3 how many ids of forgotten processes follow, whose
// state it removes, and the rest the supervisor's: working directory,
// variables, "--" and the command line. It prints the command's pid once
// the supervisor has started it, and leaves the supervisor detached: in
// its own session, with no descriptor of the exec's, so the exec ends at
// once. A set-up that failed exits 84 to 87 (setupScript's 92 to 95, less
// 8: the start script's own statuses keep their meaning), with what sh
// said of a refused variable on stderr.
const startScript = `for c in setsid mkfifo dd head tail ls mkdir mv rm sleep kill printf cat; do command -v $c >/dev/null 2>&1 || exit 127; done
s=$1; r=` + procRoot + `; d=$r/$2; n=$3; shift 3
mkdir -p "$r" || exit 94
while [ "$n" -gt 0 ]; do rm -rf "$r/$1"; shift; n=$((n-1)); done
mkdir "$d" || exit 93
mkfifo "$d/ready" || exit 94
exec 4<>"$d/ready"
setsid sh -c "$s" sh "$d" "$@" </dev/null >/dev/null 2>&1 4>&- &
read -r p <&4
case $p in "setup 9"[2-5]) head -c 4096 "$d/setup" >&2 2>/dev/null; exit $((${p#setup } - 8));; ''|*[!0-9]*) exit 95;; esac
echo "$p"`

// outputScript writes the output of process $1 from byte $2 on: a first
// line "ok" once the offset is known to be kept, then the bytes. With $3
// = 1 it follows the output until the process's output is done (polling,
// more slowly the longer nothing comes), else it stops at what is there
// now. Its last line on stderr is "end OFFSET STATUS": the offset after
// the last byte written, and the exit status or "running". An offset
// older than what is kept exits 96 (before "ok", or later when the reader
// fell behind). It keeps its pid in r.$4 while it runs, so that a reader
// whose caller went away can be ended (cancelScript).
const outputScript = procFuncs + `d=` + procRoot + `/$1; o=$2; f=$3; t=$4; M=1048576
[ -d "$d" ] || exit 92
echo $$ >"$d/r.$t"
trap 'rm -f "$d/r.$t"' EXIT
trap 'exit 143' TERM
pick() {
  c=; x=
  for y in "$d"/out.*; do
    [ -e "$y" ] || return 1
    z=${y##*/out.}; z=${z#"${z%%[!0]*}"}; z=${z:-0}
    [ "$z" -le "$1" ] || break
    c=$z; x=$y
  done
  [ -n "$x" ]
}
gone() { set -- "$d"/out.*; [ -e "$1" ]; }
if ! pick $o && gone; then exit 96; fi
echo ok
w=0
while :; do
  [ -e "$d/done" ] && fin=1
  if pick $o; then
    n=$(size "$x") || exit 94
    p=$((o - c))
    if [ "$n" -gt "$p" ]; then
      tail -c +$((p+1)) "$x" | head -c $((n-p)) || exit 94
      o=$((c+n)); w=0
      continue
    fi
  elif gone; then
    exit 96
  fi
  [ "$fin" ] && break
  [ "$f" = 1 ] || break
  { [ -d "$d" ] && ! lost; } || exit 92
  case $w in 0) w=0.01;; 0.01) w=0.02;; 0.02) w=0.05;; 0.05) w=0.1;; 0.1) w=0.2;; *) w=0.5;; esac
  sleep $w 2>/dev/null || sleep 1
done
e=$(cat "$d/exit" 2>/dev/null)
echo "end $o ${e:-running}" >&2`

// cancelScript ends the reader whose pid is in r.$2 of process $1: a
// runtime may leave a command running after its exec's stream was cut.
const cancelScript = `f=` + procRoot + `/$1/r.$2
[ -e "$f" ] || exit 0
p=$(cat "$f") && kill "$p" 2>/dev/null
rm -f "$f"`

// statusScript prints a line per process id given: "ID STATUS BYTES",
// with STATUS the exit status or "running" and BYTES the output written so
// far, or "ID missing" when its state in the sandbox is gone.
const statusScript = procFuncs + `for i; do
  d=` + procRoot + `/$i
  if [ ! -d "$d" ] || lost; then echo "$i missing"; continue; fi
  e=$(cat "$d/exit" 2>/dev/null)
  b=0
  for x in "$d"/out.*; do :; done
  if [ -e "$x" ]; then n=$(size "$x") && b=$(( $(num "$x") + n )); fi
  echo "$i ${e:-running} $b"
done`

// signalScript sends the signal $2 to the process group of process $1.
// When the process has exited it prints the exit status and exits 97.
const signalScript = procFuncs + `d=` + procRoot + `/$1
[ -d "$d" ] || exit 92
exited() { [ -e "$d/exit" ] && { cat "$d/exit"; exit 97; }; }
exited
p=$(pidf pid) || exit 92
sig "$2" "$p" || { exited; exit 94; }`

// stdinScript writes exactly $2 bytes of stdin to the stdin of process $1,
// and with $3 = 1 then closes it (the command reads end of file once every
// writer is done). The FIFO is opened read-write, so the open never waits
// for a reader. When the process has exited it prints the exit status and
// exits 97.
const stdinScript = `for c in head kill; do command -v $c >/dev/null 2>&1 || exit 127; done
d=` + procRoot + `/$1
[ -d "$d" ] || exit 92
[ -e "$d/exit" ] && { cat "$d/exit"; exit 97; }
[ -p "$d/in" ] || exit 92
exec 3<>"$d/in" || exit 94
head -c "$2" >&3 || exit 94
exec 3>&-
if [ "$3" = 1 ]; then k=$(cat "$d/keeper") && case $k in ''|*[!0-9]*|0|1) ;; *) kill "$k" 2>/dev/null;; esac; fi
exit 0`
