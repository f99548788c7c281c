package control

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// Background processes run through the exec path, each operation one of
// the fixed scripts of procscripts.go: a way in admits a session (Admit or
// AdmitWaking, as for an exec) and calls StartProcess, ProcessOutput,
// WriteStdin or SignalProcess on it. A running process does not count as
// use of its sandbox for the idle clock; a session does while it is open,
// so a caller attached to a process's output keeps the sandbox in use, and
// one that only started it does not. A look at the processes' state
// (Processes, Process) runs under a session that counts as no use.
//
// The record comes first: a start is recorded running before anything
// runs, and ended (start_failed) when the sandbox did not start it; what
// the sandbox says later (an exit status, a state gone) is written back
// whenever hiloop asks it. The record ends every running process of a
// sandbox that stops or whose pod is replaced (store.endProcesses).

// Limits of background processes.
const (
	// MaxProcesses is the most running processes of one sandbox.
	MaxProcesses = 32
	// keptProcesses is how many finished processes of one sandbox the
	// record keeps; a start forgets older ones, and their state in the
	// sandbox.
	keptProcesses = 32
	// processTimeout bounds one start, signal, stdin write or look.
	processTimeout = 30 * time.Second
	// maxScriptOutput caps what a process script's stdout and stderr are
	// read for.
	maxScriptOutput = 64 << 10
	// cancelTimeout bounds the ending of a reader whose caller left.
	cancelTimeout = 10 * time.Second
)

// What the sandbox said of a process operation (ProcessError.Kind).
var (
	// ErrProcessNotRunning: the process has exited or ended.
	ErrProcessNotRunning = errors.New("the process is not running")
	// ErrOutputGone: the output at the offset is older than what the
	// sandbox keeps, or the process's state in the sandbox is gone.
	ErrOutputGone = errors.New("the output at that offset is no longer kept")
	// ErrProcessShell: the image has no POSIX sh with the utilities the
	// process scripts run.
	ErrProcessShell = errors.New("the sandbox's image has no POSIX sh with setsid, mkfifo, head and kill, which background processes need")
	// ErrProcessRefused: a command the script ran failed; Stderr tells how.
	ErrProcessRefused = errors.New("the sandbox refused the process operation")
)

// ProcessError is a process operation the sandbox did not do, by kind,
// with the script's exit status and what it printed (at most a few KiB,
// made printable), which is fit to send: the sandbox is the caller's own.
type ProcessError struct {
	Kind   error
	Code   int
	Stderr string
}

func (e *ProcessError) Error() string {
	if e.Stderr != "" {
		return e.Kind.Error() + ": " + e.Stderr
	}
	return e.Kind.Error()
}
func (e *ProcessError) Unwrap() error { return e.Kind }

// ProcessInfo is a process's record and, when the sandbox was asked, how
// many bytes of output it has written in all.
type ProcessInfo struct {
	store.Process
	OutputBytes *int64
}

// CheckSignal refuses a signal other than api.ProcessSignals.
func CheckSignal(sig string) error {
	if !api.ValidSignal(sig) {
		return invalid("signal", fmt.Sprintf("%q is not one of %s", Truncate(sig), strings.Join(api.ProcessSignals(), ", ")))
	}
	return nil
}

// startArgv is the command line that starts process id with command
// argv in the working directory cwd ("" for the image's) with the
// variables env, removing the state of the forgotten processes. The
// caller's directory and variables are arguments of the supervisor's
// script, never its text.
func startArgv(id string, forgot, argv []string, env map[string]string, cwd string) []string {
	out := append([]string{"sh", "-c", startScript, "sh", supervisorScript, id, strconv.Itoa(len(forgot))}, forgot...)
	out = append(out, cwd)
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	out = append(out, "--")
	return append(out, argv...)
}

// CheckProcessArgv holds a process's command line to CheckArgv's limits,
// with room for its environment and working directory, the scripts that
// start it and the state of the finished processes a start removes. The
// environment and directory themselves are ValidateExecSetup's.
func CheckProcessArgv(argv []string, env map[string]string, cwd string) error {
	if err := CheckArgv(argv); err != nil {
		return err
	}
	forgot := make([]string, keptProcesses)
	for i := range forgot {
		forgot[i] = store.NewID("proc")
	}
	if CheckArgv(startArgv(store.NewID("proc"), forgot, argv, env, cwd)) != nil {
		return &ArgvError{fmt.Sprintf("exceeds %d bytes, with its env and cwd and what starts it in the background", api.MaxArgvBytes)}
	}
	return nil
}

// StartProcess starts argv detached in the session's sandbox, in the
// working directory cwd ("" for the image's) with the variables env
// added to the image's: recorded running first, then started, and
// recorded ended (start_failed) when the sandbox did not start it. It
// refuses with store.ErrProcessLimit when the sandbox has MaxProcesses
// running (having asked the sandbox which still run), with an
// *ArgvError, with a *FieldError of ValidateExecSetup before anything is
// recorded, or fails with a *SetupError when the sandbox could not enter
// cwd or set a variable (the command never ran), a *ProcessError or an
// error of Exec.
func (s *Session) StartProcess(ctx context.Context, argv []string, env map[string]string, cwd string) (store.Process, error) {
	if err := ValidateExecSetup(env, cwd); err != nil {
		return store.Process{}, err
	}
	if err := CheckProcessArgv(argv, env, cwd); err != nil {
		return store.Process{}, err
	}
	lim := store.ProcessLimits{Running: MaxProcesses, Finished: keptProcesses}
	p := store.Process{ID: store.NewID("proc"), SandboxID: s.SandboxID, Command: argv}
	rec, forgot, err := s.c.o.Store.StartProcess(ctx, s.OrgID, p, lim)
	if errors.Is(err, store.ErrProcessLimit) {
		// Some may have exited without anyone asking: ask, then try again.
		if all, lerr := s.c.o.Store.Processes(ctx, s.OrgID, s.SandboxID); lerr == nil {
			s.c.refreshIn(ctx, s, all)
		}
		rec, forgot, err = s.c.o.Store.StartProcess(ctx, s.OrgID, p, lim)
	}
	if err != nil {
		return store.Process{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, processTimeout)
	defer cancel()
	stdout, stderr := &capWriter{max: maxScriptOutput}, &capWriter{max: maxFileStderr}
	st, err := s.Exec(ctx, cluster.ExecRequest{Command: startArgv(p.ID, forgot, argv, env, cwd), Stdout: stdout, Stderr: stderr})
	switch {
	case err != nil:
		err = fileExecFailedAs(err)
	case st.Code != 0:
		err = procStartError(st.Code, cwd, stderr.buf)
	}
	if err != nil {
		wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer wcancel()
		if _, werr := s.c.o.Store.EndProcess(wctx, p.ID, store.EndStartFailed); werr != nil {
			s.c.log.Warn("record a failed process start", "sandbox", s.SandboxID, "process", p.ID, "err", werr)
		}
		return store.Process{}, err
	}
	return rec, nil
}

// procStartError is the error of a start script's exit status: a
// *SetupError for a command whose set-up failed, else procExitError's.
func procStartError(code int, cwd string, stderr []byte) error {
	e := &SetupError{Cwd: cwd, Code: code + procSetupShift}
	switch e.Code {
	case exitCwdMissing:
		e.Kind = ErrCwdNotFound
	case exitCwdNotDir:
		e.Kind = ErrCwdNotDir
	case exitCwdDenied:
		e.Kind = ErrCwdDenied
	case exitEnvRefused:
		e.Kind = ErrEnvRefused
		e.Output = strings.TrimSpace(api.Printable(string(stderr)))
	default:
		return procExitError(code, stderr)
	}
	return e
}

// procExitError is the ProcessError of a process script's exit status.
func procExitError(code int, stderr []byte) error {
	e := &ProcessError{Code: code, Stderr: strings.TrimSpace(api.Printable(string(stderr)))}
	switch code {
	case exitProcMissing:
		e.Kind = ErrOutputGone
	case exitOutputGone:
		e.Kind = ErrOutputGone
	case exitProcNotRunning:
		e.Kind = ErrProcessNotRunning
	case 126, 127:
		e.Kind = ErrProcessShell
	default:
		e.Kind = ErrProcessRefused
	}
	return e
}

// runScript runs one of the short process scripts with argv as its
// arguments and stdin, bounded by processTimeout, and returns its stdout
// and its exit status; a status other than 0 comes back as a
// *ProcessError as well.
func (s *Session) runScript(ctx context.Context, script string, stdin io.Reader, args ...string) (string, int, error) {
	ctx, cancel := context.WithTimeout(ctx, processTimeout)
	defer cancel()
	stdout, stderr := &capWriter{max: maxScriptOutput}, &capWriter{max: maxFileStderr}
	req := cluster.ExecRequest{Command: append([]string{"sh", "-c", script, "sh"}, args...), Stdout: stdout, Stderr: stderr}
	if stdin != nil {
		req.Stdin = s.In(stdin)
	}
	st, err := s.Exec(ctx, req)
	if err != nil {
		return "", -1, fileExecFailedAs(err)
	}
	if st.Code != 0 {
		return string(stdout.buf), st.Code, procExitError(st.Code, stderr.buf)
	}
	return string(stdout.buf), 0, nil
}

// fileExecFailedAs is fileExecFailed for a process script: a runtime that
// could not start sh is ErrProcessShell.
func fileExecFailedAs(err error) error {
	var fe *FileError
	if errors.As(fileExecFailed(err), &fe) {
		return &ProcessError{Kind: ErrProcessShell, Code: -1}
	}
	return err
}

// notRunning records what a script that found process id not running
// printed (its exit status) or, when its state is gone, that it ended,
// and returns ErrProcessNotRunning.
func (s *Session) notRunning(ctx context.Context, id string, code int, out string) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	switch code {
	case exitProcNotRunning:
		if n, ok := exitStatus(strings.TrimSpace(out)); ok {
			s.c.o.Store.ExitProcess(wctx, id, n)
		}
	case exitProcMissing:
		s.c.o.Store.EndProcess(wctx, id, store.EndStateLost)
	}
	return &ProcessError{Kind: ErrProcessNotRunning, Code: code}
}

// SignalProcess sends sig (one of api.ProcessSignals) to the process
// group of process id of the session's sandbox. A process that is not
// running (by the record, or by the sandbox, which is then recorded) is
// ErrProcessNotRunning.
func (s *Session) SignalProcess(ctx context.Context, id, sig string) error {
	if err := CheckSignal(sig); err != nil {
		return err
	}
	if err := s.runningProcess(ctx, id); err != nil {
		return err
	}
	out, code, err := s.runScript(ctx, signalScript, nil, id, sig)
	if code == exitProcNotRunning || code == exitProcMissing {
		return s.notRunning(ctx, id, code, out)
	}
	return err
}

// WriteStdin writes exactly size bytes of body (at most
// api.MaxProcessStdin) to the stdin of process id, and closes its stdin
// after when close is set. Its errors are SignalProcess's, or an
// *UploadCutError when body ended short.
func (s *Session) WriteStdin(ctx context.Context, id string, size int64, body io.Reader, close bool) error {
	if size < 0 || size > api.MaxProcessStdin {
		return invalid("body", fmt.Sprintf("stdin takes at most %d bytes at a time", api.MaxProcessStdin))
	}
	if err := s.runningProcess(ctx, id); err != nil {
		return err
	}
	flag := "0"
	if close {
		flag = "1"
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	in := &cutReader{r: io.LimitReader(body, size), cancel: cancel}
	out, code, err := s.runScript(ctx, stdinScript, in, id, strconv.FormatInt(size, 10), flag)
	switch {
	case in.err != nil:
		return &UploadCutError{Got: in.n, Want: size, Err: in.err}
	case code == exitProcNotRunning || code == exitProcMissing:
		return s.notRunning(ctx, id, code, out)
	}
	return err
}

// runningProcess refuses a process the record does not hold as running
// in the session's sandbox: store.ErrNotFound, or ErrProcessNotRunning.
func (s *Session) runningProcess(ctx context.Context, id string) error {
	p, err := s.c.o.Store.Process(ctx, s.OrgID, s.SandboxID, id)
	if err != nil {
		return err
	}
	if p.State != store.ProcessRunning {
		return &ProcessError{Kind: ErrProcessNotRunning}
	}
	return nil
}

// ProcessRecord is one process of one of the caller's organization's
// sandboxes, as the record holds it, without asking the sandbox.
func (c *Control) ProcessRecord(ctx context.Context, who Caller, sandboxID, id string) (store.Process, error) {
	if err := c.keyLive(ctx, who); err != nil {
		return store.Process{}, err
	}
	return c.o.Store.Process(ctx, who.OrgID, sandboxID, id)
}

// Processes lists the processes of one of the caller's organization's
// sandboxes, newest first. When the sandbox runs, the state of those the
// record holds running is asked of it first, under a session that counts
// as no use; when it cannot answer, the record's is given.
func (c *Control) Processes(ctx context.Context, who Caller, sandboxID string) ([]ProcessInfo, error) {
	if err := c.keyLive(ctx, who); err != nil {
		return nil, err
	}
	all, err := c.o.Store.Processes(ctx, who.OrgID, sandboxID)
	if err != nil {
		return nil, err
	}
	bytes := c.refresh(ctx, who, sandboxID, all)
	if bytes == nil {
		return infos(all, nil), nil
	}
	if all, err = c.o.Store.Processes(ctx, who.OrgID, sandboxID); err != nil {
		return nil, err
	}
	return infos(all, bytes), nil
}

// Process is one process of one of the caller's organization's sandboxes,
// asked of the sandbox as Processes does.
func (c *Control) Process(ctx context.Context, who Caller, sandboxID, id string) (ProcessInfo, error) {
	p, err := c.ProcessRecord(ctx, who, sandboxID, id)
	if err != nil {
		return ProcessInfo{}, err
	}
	bytes := c.refresh(ctx, who, sandboxID, []store.Process{p})
	if bytes != nil {
		if p, err = c.o.Store.Process(ctx, who.OrgID, sandboxID, id); err != nil {
			return ProcessInfo{}, err
		}
	}
	return infos([]store.Process{p}, bytes)[0], nil
}

func infos(ps []store.Process, bytes map[string]int64) []ProcessInfo {
	out := make([]ProcessInfo, len(ps))
	for i, p := range ps {
		out[i].Process = p
		if n, ok := bytes[p.ID]; ok {
			out[i].OutputBytes = &n
		}
	}
	return out
}

// refresh asks the sandbox for the state of the processes of ps that the
// record holds running, under a session that counts as no use, and writes
// back what changed. It returns the output bytes of those it asked for,
// or nil when it asked nothing (none running, or the sandbox cannot be
// reached now).
func (c *Control) refresh(ctx context.Context, who Caller, sandboxID string, ps []store.Process) map[string]int64 {
	if !anyRunning(ps) {
		return nil
	}
	s, err := c.admitSession(ctx, who, sandboxID, receipt.TransportExec, false)
	if err != nil {
		return nil
	}
	defer s.End()
	return c.refreshIn(ctx, s, ps)
}

func anyRunning(ps []store.Process) bool {
	for _, p := range ps {
		if p.State == store.ProcessRunning {
			return true
		}
	}
	return false
}

// refreshIn is refresh within the session s.
func (c *Control) refreshIn(ctx context.Context, s *Session, ps []store.Process) map[string]int64 {
	var ids []string
	asked := map[string]store.Process{}
	for _, p := range ps {
		if p.State == store.ProcessRunning {
			ids = append(ids, p.ID)
			asked[p.ID] = p
		}
	}
	if len(ids) == 0 {
		return nil
	}
	out, _, err := s.runScript(ctx, statusScript, nil, ids...)
	if err != nil {
		c.log.Debug("ask a sandbox for its processes", "sandbox", s.SandboxID, "err", err)
		return nil
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	bytes := map[string]int64{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		p, ok := asked[f[0]]
		if !ok {
			continue
		}
		delete(asked, f[0])
		switch {
		case f[1] == "missing":
			// A start under way has recorded the process but may not
			// have made its state yet.
			if c.o.Now().Sub(p.StartedAt) > processTimeout {
				c.o.Store.EndProcess(wctx, p.ID, store.EndStateLost)
			}
			continue
		case f[1] != "running":
			if n, ok := exitStatus(f[1]); ok {
				c.o.Store.ExitProcess(wctx, p.ID, n)
			}
		}
		if len(f) == 3 {
			if n, ok := byteCount(f[2]); ok {
				bytes[p.ID] = n
			}
		}
	}
	return bytes
}

// ProcessOutput is a process's output on its way out of the sandbox
// (Session.ProcessOutput). Like a Download, the reader writes into a pipe
// that Read reads: a slow caller slows the reader, and the sandbox keeps
// the output meanwhile, never hiloop.
type ProcessOutput struct {
	out     io.Reader
	id      string
	token   string
	s       *Session
	cancel  context.CancelFunc
	pr      *io.PipeReader
	stderr  *capWriter
	ended   func() execResult
	follow  bool
	offset  int64
	n       int64
	endOnce sync.Once
}

// OutputEnd is how an output's reading ended: Offset is the offset after
// its last byte; Exited and ExitCode say whether the process had exited
// then, and with what status. Complete is set when a follow read all of
// the output of a process that ended.
type OutputEnd struct {
	Offset   int64
	Exited   bool
	ExitCode int
	Complete bool
}

// ProcessOutput starts reading the output of process id of the session's
// sandbox from offset, following it as it grows when follow is set. It
// answers ErrOutputGone (a *ProcessError) for an offset older than what is
// kept or a process whose state is gone (ended, or forgotten by its
// sandbox), store.ErrNotFound, an error of Exec, or a *ProcessOutput,
// which its caller reads, ends with Done and always Closes.
func (s *Session) ProcessOutput(ctx context.Context, id string, offset int64, follow bool) (*ProcessOutput, error) {
	if offset < 0 {
		return nil, invalid("offset", "must be 0 or more")
	}
	p, err := s.c.o.Store.Process(ctx, s.OrgID, s.SandboxID, id)
	if err != nil {
		return nil, err
	}
	if p.State == store.ProcessEnded {
		return nil, &ProcessError{Kind: ErrOutputGone}
	}
	// A follow is bounded as an exec stream is; its caller attaches again.
	ctx, cancel := context.WithTimeout(ctx, api.MaxExecTimeout)
	pr, pw := io.Pipe()
	o := &ProcessOutput{id: id, token: randomSuffix(), s: s, cancel: cancel, pr: pr, stderr: &capWriter{max: maxScriptOutput},
		follow: follow, offset: offset}
	f := "0"
	if follow {
		f = "1"
	}
	done := make(chan execResult, 1)
	go func() {
		st, err := s.Exec(ctx, cluster.ExecRequest{Command: []string{"sh", "-c", outputScript, "sh", id, strconv.FormatInt(offset, 10), f, o.token},
			Stdout: s.Out(pw), Stderr: o.stderr})
		pw.Close()
		done <- execResult{st, err}
	}()
	o.ended = sync.OnceValue(func() execResult { return <-done })
	br := bufio.NewReaderSize(pr, 64<<10)
	line, herr := br.ReadSlice('\n')
	if herr != nil || string(line) != "ok\n" {
		pr.CloseWithError(errAnswered)
		res := o.ended()
		o.Close()
		switch {
		case res.err != nil:
			return nil, fileExecFailedAs(res.err)
		case res.st.Code == exitProcMissing:
			s.notRunning(ctx, id, exitProcMissing, "")
			return nil, &ProcessError{Kind: ErrOutputGone, Code: exitProcMissing}
		case res.st.Code != 0:
			return nil, procExitError(res.st.Code, o.stderr.buf)
		}
		// Not the script's answer (a sandbox whose sh or utilities were
		// replaced): the sandbox's doing, not hiloop's failure.
		return nil, &ProcessError{Kind: ErrProcessRefused, Code: res.st.Code, Stderr: "its answer to the output read was not the script's"}
	}
	o.out = br
	return o, nil
}

// Read reads the output.
func (o *ProcessOutput) Read(p []byte) (int, error) {
	n, err := o.out.Read(p)
	o.n += int64(n)
	return n, err
}

// Done ends an output whose reading stopped, with cut the error that
// stopped it early (its caller could not pass on what it read), if any.
// It waits for the reader in the sandbox and says how the output ended;
// a follow that reached the end of an exited process's output records its
// exit status. An error means the output is not whole: ErrOutputGone (the
// reader fell behind what is kept), an error of Exec, or cut.
func (o *ProcessOutput) Done(cut error) (OutputEnd, error) {
	if cut != nil {
		o.cancel()
		o.pr.CloseWithError(errAnswered)
	}
	res := o.ended()
	end := OutputEnd{Offset: o.offset + o.n}
	// Any end but the reader's own leaves it to stop: a runtime may keep
	// running the command of an exec its caller, a revoke, a stop or the
	// deadline cut.
	if cut != nil || res.err != nil {
		o.stopReader()
	}
	switch {
	case cut != nil:
		return end, cut
	case res.err != nil:
		return end, res.err
	case res.st.Code == exitProcMissing:
		// The process's state vanished under the reader, or its
		// supervisor was killed: it is not running, nor will it say how
		// it ended.
		o.s.notRunning(o.s.Context(), o.id, exitProcMissing, "")
		return end, &ProcessError{Kind: ErrOutputGone, Code: exitProcMissing}
	case res.st.Code != 0:
		return end, procExitError(res.st.Code, o.stderr.buf)
	}
	f := strings.Fields(lastLine(string(o.stderr.buf)))
	if len(f) != 3 || f[0] != "end" {
		return end, fmt.Errorf("process output: unreadable end from the sandbox")
	}
	if f[2] != "running" {
		n, ok := exitStatus(f[2])
		if !ok {
			return end, fmt.Errorf("process output: unreadable exit status from the sandbox")
		}
		end.Exited, end.ExitCode, end.Complete = true, n, o.follow
		wctx, cancel := context.WithTimeout(context.WithoutCancel(o.s.Context()), 5*time.Second)
		defer cancel()
		if _, err := o.s.c.o.Store.ExitProcess(wctx, o.id, n); err != nil {
			o.s.c.log.Warn("record a process's exit", "process", o.id, "err", err)
		}
	}
	return end, nil
}

// stopReader ends the reader in the sandbox, within the session but past
// its caller's context: a runtime may leave a command running after its
// exec's stream was cut, and a reader that follows a quiet process would
// poll until the process ends.
func (o *ProcessOutput) stopReader() {
	o.endOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(o.s.Context()), cancelTimeout)
		defer cancel()
		if st, err := o.s.Exec(ctx, cluster.ExecRequest{Command: []string{"sh", "-c", cancelScript, "sh", o.id, o.token}, Stdout: io.Discard, Stderr: io.Discard}); err != nil || st.Code != 0 {
			o.s.c.log.Debug("could not end a process output reader", "sandbox", o.s.SandboxID, "process", o.id, "exit", st.Code, "err", err)
		}
	})
}

// Close ends the reader, when it still runs, and waits for it.
func (o *ProcessOutput) Close() {
	o.cancel()
	o.pr.CloseWithError(errAnswered)
	o.ended()
}

// exitStatus reads an exit status as the scripts write it: 1 to 3
// decimal digits, at most 255, nothing else (no sign, no spaces).
func exitStatus(s string) (int, bool) {
	if len(s) == 0 || len(s) > 3 || strings.Trim(s, "0123456789") != "" {
		return 0, false
	}
	n, _ := strconv.Atoi(s)
	return n, n <= 255
}

// byteCount reads a byte count as the scripts write it: decimal digits
// that fit an int64, nothing else.
func byteCount(s string) (int64, bool) {
	if len(s) == 0 || strings.Trim(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
