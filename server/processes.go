package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/store"
)

// Background processes: the scripts, the record and the limits are the
// core's (control/processes.go); these handlers parse the request and
// write the answer. Every call that reaches into the sandbox is admitted
// as an exec session (admitExec); only a start may wake the sandbox,
// since a process does not outlive its sandbox's stop.

func processJSON(p control.ProcessInfo) api.Process {
	out := api.Process{ID: p.ID, SandboxID: p.SandboxID, Command: p.Command, State: string(p.State), ExitCode: p.ExitCode,
		Reason: string(p.Reason), StartedAt: p.StartedAt, EndedAt: p.EndedAt, OutputBytes: p.OutputBytes}
	if out.Command == nil {
		out.Command = []string{}
	}
	return out
}

func (s *Server) startProcess(w http.ResponseWriter, r *http.Request) {
	if err := knownQuery(r.URL.Query(), "wake"); err != nil {
		s.writeError(w, r, err)
		return
	}
	var req api.StartProcessRequest
	if err := decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := control.ValidateExecSetup(req.Env, req.Cwd); err != nil {
		s.writeError(w, r, err)
		return
	}
	var ae *control.ArgvError
	if err := control.CheckProcessArgv(req.Command, req.Env, req.Cwd); errors.As(err, &ae) {
		s.writeError(w, r, fieldError("command", ae.Problem))
		return
	}
	sess, ok := s.admitExec(w, r, r.PathValue("id"), "process")
	if !ok {
		return
	}
	defer sess.End()
	p, err := sess.StartProcess(sess.Context(), req.Command, req.Env, req.Cwd)
	if err != nil {
		s.writeError(w, r, processFailed(err))
		return
	}
	writeJSON(w, http.StatusCreated, processJSON(control.ProcessInfo{Process: p}))
}

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request) {
	if err := knownQuery(r.URL.Query()); err != nil {
		s.writeError(w, r, err)
		return
	}
	ps, err := s.o.Control.Processes(r.Context(), caller(r), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := api.ProcessList{Items: make([]api.Process, len(ps))}
	for i, p := range ps {
		out.Items[i] = processJSON(p)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getProcess(w http.ResponseWriter, r *http.Request) {
	if err := knownQuery(r.URL.Query()); err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := s.o.Control.Process(r.Context(), caller(r), r.PathValue("id"), r.PathValue("pid"))
	if err != nil {
		s.writeError(w, r, processFailed(err))
		return
	}
	writeJSON(w, http.StatusOK, processJSON(p))
}

// runningProcess answers unless process pid of the request's sandbox is
// one the record holds running: 404 for an unknown one (another
// organization's too), 409 process_not_running for one that finished.
// It is checked before admission, so a finished process of a stopped
// sandbox says so rather than that the sandbox is not running.
func (s *Server) runningProcess(w http.ResponseWriter, r *http.Request) bool {
	p, err := s.o.Control.ProcessRecord(r.Context(), caller(r), r.PathValue("id"), r.PathValue("pid"))
	if err == nil && p.State != store.ProcessRunning {
		err = &control.ProcessError{Kind: control.ErrProcessNotRunning}
	}
	if err != nil {
		s.writeError(w, r, processFailed(err))
		return false
	}
	return true
}

func (s *Server) killProcess(w http.ResponseWriter, r *http.Request) {
	if err := knownQuery(r.URL.Query()); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.signal(w, r, "KILL")
}

func (s *Server) signalProcess(w http.ResponseWriter, r *http.Request) {
	if err := knownQuery(r.URL.Query()); err != nil {
		s.writeError(w, r, err)
		return
	}
	var req api.SignalRequest
	if err := decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := control.CheckSignal(req.Signal); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.signal(w, r, req.Signal)
}

// signal sends sig to the request's process and answers the process as
// the record holds it after.
func (s *Server) signal(w http.ResponseWriter, r *http.Request, sig string) {
	if !s.runningProcess(w, r) {
		return
	}
	sess, ok := s.admitExec(w, r, r.PathValue("id"), "process")
	if !ok {
		return
	}
	defer sess.End()
	if err := sess.SignalProcess(sess.Context(), r.PathValue("pid"), sig); err != nil {
		s.writeError(w, r, processFailed(err))
		return
	}
	s.answerProcess(w, r, http.StatusOK)
}

// answerProcess answers the request's process as the record holds it.
func (s *Server) answerProcess(w http.ResponseWriter, r *http.Request, status int) {
	p, err := s.o.Control.ProcessRecord(r.Context(), caller(r), r.PathValue("id"), r.PathValue("pid"))
	if err != nil {
		s.writeError(w, r, processFailed(err))
		return
	}
	writeJSON(w, status, processJSON(control.ProcessInfo{Process: p}))
}

func (s *Server) writeStdin(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if err := knownQuery(q, "close"); err != nil {
		s.writeError(w, r, err)
		return
	}
	closeIn, err := boolQuery(q, "close")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, api.MaxProcessStdin))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			s.writeError(w, r, newError(http.StatusRequestEntityTooLarge, api.CodeBodyTooLarge, fmt.Sprintf("stdin takes at most %d bytes at a time", api.MaxProcessStdin)))
			return
		}
		s.writeError(w, r, newError(http.StatusBadRequest, api.CodeUploadIncomplete, "could not read the body"))
		return
	}
	if !s.runningProcess(w, r) {
		return
	}
	sess, ok := s.admitExec(w, r, r.PathValue("id"), "process")
	if !ok {
		return
	}
	defer sess.End()
	if err := sess.WriteStdin(sess.Context(), r.PathValue("pid"), int64(len(body)), bytes.NewReader(body), closeIn); err != nil {
		s.writeError(w, r, processFailed(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) processOutput(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if err := knownQuery(q, "offset", "follow"); err != nil {
		s.writeError(w, r, err)
		return
	}
	follow, err := boolQuery(q, "follow")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var offset int64
	if v := q.Get("offset"); v != "" {
		if offset, err = strconv.ParseInt(v, 10, 64); err != nil || offset < 0 {
			s.writeError(w, r, fieldError("offset", "must be a byte offset, 0 or more"))
			return
		}
	}
	pid := r.PathValue("pid")
	// An ended process's output went with its pod: that is the answer,
	// whatever its sandbox does now.
	p, err := s.o.Control.ProcessRecord(r.Context(), caller(r), r.PathValue("id"), pid)
	if err == nil && p.State == store.ProcessEnded {
		err = &control.ProcessError{Kind: control.ErrOutputGone}
	}
	if err != nil {
		s.writeError(w, r, processFailed(err))
		return
	}
	sess, ok := s.admitExec(w, r, r.PathValue("id"), "process")
	if !ok {
		return
	}
	defer sess.End()
	out, err := sess.ProcessOutput(sess.Context(), pid, offset, follow)
	if err != nil {
		s.writeError(w, r, processFailed(err))
		return
	}
	defer out.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set(api.OutputOffsetHeader, strconv.FormatInt(offset, 10))
	w.WriteHeader(http.StatusOK)
	fw := &flushWriter{w: w, rc: http.NewResponseController(w)}
	fw.rc.Flush()
	n, cerr := io.CopyBuffer(fw, out, make([]byte, 64<<10))
	// A response that ends whole is the whole output asked for (and with
	// follow, the process ended); anything else cuts the connection, so
	// the client sees a broken stream, never a short one that looks whole,
	// and attaches again from where it got.
	if _, derr := out.Done(cerr); derr != nil {
		s.log.Info("process output cut", "sandbox", r.PathValue("id"), "process", pid, "bytes", n, "err", derr, "request_id", info(r).id)
		panic(http.ErrAbortHandler)
	}
}

// flushWriter sends each write to the client at once: output is read as
// it comes.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f *flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

// processFailed maps a process operation the core did not do to the
// answer.
func processFailed(err error) error {
	var pe *control.ProcessError
	var cut *control.UploadCutError
	var ae *control.ArgvError
	var sf *control.SetupError
	switch {
	case errors.As(err, &sf):
		return setupFailed(err)
	case errors.Is(err, store.ErrProcessLimit):
		return newError(http.StatusTooManyRequests, api.CodeProcessLimit, fmt.Sprintf("the sandbox runs %d processes, the most it may; wait for one to exit or kill one", control.MaxProcesses))
	case errors.Is(err, store.ErrNotFound):
		return newError(http.StatusNotFound, api.CodeNotFound, "no such sandbox or process")
	case errors.As(err, &ae):
		return fieldError("command", ae.Problem)
	case errors.As(err, &cut):
		return newError(http.StatusBadRequest, api.CodeUploadIncomplete, "the body ended early; nothing was written")
	case !errors.As(err, &pe):
		return execFailed(err)
	}
	switch pe.Kind {
	case control.ErrProcessNotRunning:
		return newError(http.StatusConflict, api.CodeProcessNotRunning, "the process is not running")
	case control.ErrOutputGone:
		return newError(http.StatusGone, api.CodeOutputGone, fmt.Sprintf("the output at that offset is no longer kept: the sandbox keeps the newest %d MiB or more of a process's output while the process's sandbox runs; GET the process for output_bytes", api.MaxProcessOutputKept>>20))
	case control.ErrProcessShell:
		return newError(http.StatusUnprocessableEntity, api.CodeShellUnavailable, control.ErrProcessShell.Error())
	}
	msg := pe.Stderr
	if msg == "" {
		msg = fmt.Sprintf("the command in the sandbox exited %d", pe.Code)
	}
	return newError(http.StatusUnprocessableEntity, api.CodeProcessOperationFailed, "the sandbox refused: "+msg)
}
