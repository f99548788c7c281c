package forward

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// The mux carries many streams over one connection (the gateway's TLS
// connection to a helper), each with its own flow control. A frame is a
// 9-byte header, type, stream id and payload length (big endian), and the
// payload:
//
//	open    the stream's open request (OpenRequest); only the dialling side opens
//	accept  the open succeeded: data may flow both ways
//	reject  the open failed: a reason byte and a message
//	data    bytes of the stream, at most the receiver's window
//	window  the receiver consumed the 4-byte count more bytes
//	fin     the sender sends no more (a half-close, the stream's EOF)
//	reset   the sender is done with the stream both ways (a full close)
//
// Each side may have at most Window bytes of a stream in flight that the
// other side has not read: a slow reader of one stream stalls only that
// stream, and a stream holds at most Window bytes of memory on either side.
const (
	frameOpen byte = iota + 1
	frameAccept
	frameReject
	frameData
	frameWindow
	frameFin
	frameReset
)

const (
	headerSize = 9
	// maxFrame bounds a frame's payload, which the receiver reads whole.
	maxFrame = 64 << 10
	// Window is how many bytes of one stream may be sent and not yet read.
	Window = 1 << 20
	// MaxStreams is how many streams one connection may have open at once,
	// the default of MuxOptions.MaxStreams.
	MaxStreams = 256
)

// ErrMuxClosed is returned by a stream whose connection ended.
var ErrMuxClosed = errors.New("the connection to the session helper ended")

// errReset is returned by a stream the other side reset.
var errReset = errors.New("stream reset by the other side")

// OpenError is a refused open: Reason is an SSH channel-open failure code
// (RFC 4254 5.1), which the gateway passes on to its client with Message.
type OpenError struct {
	Reason  uint8
	Message string
}

func (e *OpenError) Error() string { return fmt.Sprintf("open refused (%d): %s", e.Reason, e.Message) }

// Open failure reasons, as SSH numbers them.
const (
	Prohibited         uint8 = 1
	ConnectionFailed   uint8 = 2
	ResourceShortage   uint8 = 4
	maxOpenRequestSize       = 4 + 1 + 255
)

// MuxOptions configure NewMux.
type MuxOptions struct {
	// Server is the side that accepts streams (the helper); the other side
	// opens them (the gateway).
	Server bool
	// MaxStreams bounds the streams open at once; MaxStreams when zero. A
	// server refuses an open past it with ResourceShortage.
	MaxStreams int
	// WriteTimeout, when not zero, bounds each frame's write: the other
	// side's reader never waits on anything, so a frame it takes no
	// longer than this to take in means it stopped reading (a program of
	// the tenant's in the helper's place), and the mux ends rather than
	// hold the writer, its stream and every stream queued behind it.
	WriteTimeout time.Duration
}

// Mux multiplexes streams over one connection.
type Mux struct {
	conn   net.Conn
	server bool
	max    int
	wto    time.Duration

	wmu  sync.Mutex // serialises frames on conn
	wbuf []byte

	// omu orders opens: a stream's id is given and its open frame written
	// under it, so ids reach the other side in the order they were given,
	// which takes an id that is not above the last as a protocol error.
	omu sync.Mutex

	mu      sync.Mutex
	streams map[uint32]*Stream
	lastID  uint32
	err     error // why the mux ended, once it did
	accept  chan *Stream
	closed  chan struct{}
	pool    sync.Pool
	readEnd chan struct{}
}

// NewMux starts a mux on conn; it owns conn from now on, and closing the mux
// closes it.
func NewMux(conn net.Conn, o MuxOptions) *Mux {
	if o.MaxStreams == 0 {
		o.MaxStreams = MaxStreams
	}
	m := &Mux{conn: conn, server: o.Server, max: o.MaxStreams, wto: o.WriteTimeout, streams: map[uint32]*Stream{},
		closed: make(chan struct{}), readEnd: make(chan struct{}), wbuf: make([]byte, headerSize+maxFrame)}
	m.pool.New = func() any { return make([]byte, maxFrame) }
	if o.Server {
		// Live streams, queued ones included, never pass max, so the reader
		// never blocks handing one over.
		m.accept = make(chan *Stream, o.MaxStreams)
	}
	go m.read()
	return m
}

// Close ends the mux and every stream on it.
func (m *Mux) Close() error {
	m.fail(ErrMuxClosed)
	<-m.readEnd
	return nil
}

// Done is closed once the mux ended.
func (m *Mux) Done() <-chan struct{} { return m.closed }

// Err is why the mux ended, nil while it runs.
func (m *Mux) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Streams is the number of streams open now.
func (m *Mux) Streams() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.streams)
}

func (m *Mux) fail(err error) {
	m.mu.Lock()
	if m.err != nil {
		m.mu.Unlock()
		return
	}
	m.err = err
	streams := m.streams
	m.streams = map[uint32]*Stream{}
	close(m.closed)
	m.mu.Unlock()
	m.conn.Close()
	for _, s := range streams {
		s.wake()
	}
}

// writeFrame sends one frame. Only a stream's own goroutines call it, never
// the reader: a reader blocked on a write while its peer's reader is
// blocked on one too would stall both connections' directions for good.
func (m *Mux) writeFrame(typ byte, id uint32, payload []byte) error {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	b := m.wbuf[:headerSize+len(payload)]
	b[0] = typ
	binary.BigEndian.PutUint32(b[1:], id)
	binary.BigEndian.PutUint32(b[5:], uint32(len(payload)))
	copy(b[headerSize:], payload)
	if m.wto > 0 {
		m.conn.SetWriteDeadline(time.Now().Add(m.wto))
	}
	if _, err := m.conn.Write(b); err != nil {
		m.fail(ErrMuxClosed)
		return ErrMuxClosed
	}
	return nil
}

// read dispatches frames until the connection fails or breaks the protocol.
func (m *Mux) read() {
	defer close(m.readEnd)
	hdr := make([]byte, headerSize)
	for {
		if _, err := io.ReadFull(m.conn, hdr); err != nil {
			m.fail(ErrMuxClosed)
			return
		}
		typ, id, n := hdr[0], binary.BigEndian.Uint32(hdr[1:]), binary.BigEndian.Uint32(hdr[5:])
		if n > maxFrame {
			m.fail(fmt.Errorf("frame of %d bytes: %w", n, ErrMuxClosed))
			return
		}
		buf := m.pool.Get().([]byte)[:n]
		if _, err := io.ReadFull(m.conn, buf); err != nil {
			m.fail(ErrMuxClosed)
			return
		}
		if err := m.dispatch(typ, id, buf); err != nil {
			m.fail(fmt.Errorf("%v: %w", err, ErrMuxClosed))
			return
		}
	}
}

// dispatch handles one frame; buf is the mux's until dispatch keeps it.
func (m *Mux) dispatch(typ byte, id uint32, buf []byte) error {
	if typ == frameOpen {
		defer m.pool.Put(buf[:cap(buf)])
		return m.opened(id, buf)
	}
	m.mu.Lock()
	s := m.streams[id]
	m.mu.Unlock()
	if s == nil {
		// A frame for a stream already reset, which crossed the reset.
		m.pool.Put(buf[:cap(buf)])
		return nil
	}
	switch typ {
	case frameData:
		if len(buf) == 0 {
			m.pool.Put(buf[:cap(buf)])
			return nil
		}
		return s.received(buf)
	}
	defer m.pool.Put(buf[:cap(buf)])
	switch typ {
	case frameAccept, frameReject:
		if m.server {
			return errors.New("accept or reject sent to the accepting side")
		}
		// One answer per open: a reject after the accept would drop a
		// stream in use from the routes, its reads waiting for good.
		s.mu.Lock()
		again := s.gotAnswer
		s.gotAnswer = true
		s.mu.Unlock()
		if again {
			return errors.New("an open answered twice")
		}
		var err error
		if typ == frameReject {
			if len(buf) < 1 {
				return errors.New("empty reject")
			}
			err = &OpenError{Reason: buf[0], Message: string(buf[1:])}
			m.forget(s)
		}
		s.answered(err)
	case frameWindow:
		if len(buf) != 4 {
			return errors.New("malformed window update")
		}
		return s.credit(binary.BigEndian.Uint32(buf))
	case frameFin:
		s.remoteFin()
	case frameReset:
		m.forget(s)
		s.remoteReset()
	default:
		return fmt.Errorf("unknown frame type %d", typ)
	}
	return nil
}

// opened registers a stream the other side opens: only a server accepts
// them, ids only grow, and past max the open is refused.
func (m *Mux) opened(id uint32, req []byte) error {
	if !m.server {
		return errors.New("open sent to the opening side")
	}
	if len(req) > maxOpenRequestSize {
		return errors.New("open request too long")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if id <= m.lastID {
		return errors.New("stream id reused")
	}
	m.lastID = id
	if len(m.streams) >= m.max {
		// Answered off the reader (see writeFrame); the opener is the
		// gateway, which keeps within the cap, so this is rare.
		go m.writeFrame(frameReject, id, append([]byte{ResourceShortage}, fmt.Sprintf("too many streams open to the session helper (%d)", m.max)...))
		return nil
	}
	s := m.newStream(id)
	s.req = append([]byte(nil), req...)
	select {
	case m.accept <- s:
		m.streams[id] = s
	default:
		// Streams reset while queued make room for others: refuse rather
		// than block the reader.
		go m.writeFrame(frameReject, id, append([]byte{ResourceShortage}, "too many streams waiting for the session helper"...))
	}
	return nil
}

func (m *Mux) newStream(id uint32) *Stream {
	return &Stream{m: m, id: id, sendWin: Window, readable: make(chan struct{}, 1), writable: make(chan struct{}, 1), answer: make(chan error, 1)}
}

// Accept returns the next stream the other side opened, with its request
// (Stream.Request); the caller answers it with Stream.Accept or Reject.
func (m *Mux) Accept() (*Stream, error) {
	select {
	case s := <-m.accept:
		return s, nil
	case <-m.closed:
		return nil, m.Err()
	}
}

// Open opens a stream with request req and waits for the other side's
// answer, or for done to close; a refusal is an *OpenError.
func (m *Mux) Open(done <-chan struct{}, req []byte) (*Stream, error) {
	m.omu.Lock()
	m.mu.Lock()
	if m.err != nil {
		m.mu.Unlock()
		m.omu.Unlock()
		return nil, m.err
	}
	if len(m.streams) >= m.max {
		m.mu.Unlock()
		m.omu.Unlock()
		return nil, &OpenError{Reason: ResourceShortage, Message: fmt.Sprintf("too many streams open to the session helper (%d)", m.max)}
	}
	m.lastID++
	s := m.newStream(m.lastID)
	m.streams[s.id] = s
	m.mu.Unlock()
	err := m.writeFrame(frameOpen, s.id, req)
	m.omu.Unlock()
	if err != nil {
		return nil, err
	}
	select {
	case err := <-s.answer:
		if err != nil {
			return nil, err
		}
		return s, nil
	case <-m.closed:
		return nil, m.Err()
	case <-done:
		s.Close()
		return nil, errors.New("open abandoned")
	}
}

// forget drops s from the streams the mux routes frames to.
func (m *Mux) forget(s *Stream) {
	m.mu.Lock()
	if m.streams[s.id] == s {
		delete(m.streams, s.id)
	}
	m.mu.Unlock()
}

// Stream is one stream of a Mux: an io.ReadWriteCloser with CloseWrite.
type Stream struct {
	m   *Mux
	id  uint32
	req []byte

	answer chan error // the open's answer, for the opening side
	// readable and writable wake a waiting Read and Write: one of each at
	// most waits (io.Copy in each direction).
	readable, writable chan struct{}

	mu       sync.Mutex
	rq       [][]byte // received and not yet read, each from the mux's pool
	rqOff    int      // bytes of rq[0] already read
	rqLen    int      // bytes in rq not yet read
	consumed int      // bytes read since the last window update
	sendWin  int
	gotFin   bool // the other side sends no more
	sentFin  bool // this side sends no more
	reset    bool // the stream is over both ways
	// gotAnswer: the other side accepted or rejected the open.
	gotAnswer bool
	wmu       sync.Mutex
}

// Request is the open request the other side sent.
func (s *Stream) Request() []byte { return s.req }

// Accept tells the opener the stream is open.
func (s *Stream) Accept() error { return s.m.writeFrame(frameAccept, s.id, nil) }

// Reject refuses the stream with an SSH channel-open failure reason and a
// message for the client.
func (s *Stream) Reject(reason uint8, msg string) error {
	s.m.forget(s)
	return s.m.writeFrame(frameReject, s.id, append([]byte{reason}, msg...))
}

func (s *Stream) wake() {
	signal(s.readable)
	signal(s.writable)
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (s *Stream) answered(err error) {
	select {
	case s.answer <- err:
	default:
	}
}

// received queues a data frame; more than the window allows breaks the
// protocol.
func (s *Stream) received(buf []byte) error {
	s.mu.Lock()
	if s.gotFin {
		s.mu.Unlock()
		return errors.New("data after fin")
	}
	if s.reset {
		// Read and dropped: this side is done with the stream.
		s.mu.Unlock()
		s.m.pool.Put(buf[:cap(buf)])
		return nil
	}
	if s.rqLen+len(buf) > Window {
		s.mu.Unlock()
		return errors.New("window exceeded")
	}
	// Small frames are gathered into the last buffer, so memory held is
	// within twice the window whatever the sizes the other side writes.
	if k := len(s.rq) - 1; k >= 0 && cap(s.rq[k])-len(s.rq[k]) >= len(buf) {
		s.rq[k] = append(s.rq[k], buf...)
		s.m.pool.Put(buf[:cap(buf)])
	} else {
		s.rq = append(s.rq, buf)
	}
	s.rqLen += len(buf)
	s.mu.Unlock()
	signal(s.readable)
	return nil
}

func (s *Stream) credit(n uint32) error {
	if n > Window {
		// Checked before the sum, which a 32-bit int would wrap.
		return errors.New("window update past the window")
	}
	s.mu.Lock()
	s.sendWin += int(n)
	over := s.sendWin > Window
	s.mu.Unlock()
	if over {
		return errors.New("window update past the window")
	}
	signal(s.writable)
	return nil
}

func (s *Stream) remoteFin() {
	s.mu.Lock()
	s.gotFin = true
	done := s.sentFin
	s.mu.Unlock()
	if done {
		s.m.forget(s)
	}
	s.wake()
}

func (s *Stream) remoteReset() {
	s.mu.Lock()
	s.reset = true
	s.mu.Unlock()
	s.wake()
}

// muxErr is the mux's error once it ended, else nil.
func (s *Stream) muxErr() error {
	select {
	case <-s.m.closed:
		return ErrMuxClosed
	default:
		return nil
	}
}

// Read reads what the other side sent; io.EOF after its fin.
func (s *Stream) Read(p []byte) (int, error) {
	for {
		s.mu.Lock()
		if s.rqLen > 0 {
			n := 0
			for n < len(p) && len(s.rq) > 0 {
				c := copy(p[n:], s.rq[0][s.rqOff:])
				n += c
				s.rqOff += c
				if s.rqOff == len(s.rq[0]) {
					s.m.pool.Put(s.rq[0][:cap(s.rq[0])])
					s.rq[0] = nil
					s.rq = s.rq[1:]
					s.rqOff = 0
				}
			}
			s.rqLen -= n
			s.consumed += n
			var credit int
			if s.consumed >= Window/4 && !s.gotFin {
				credit, s.consumed = s.consumed, 0
			}
			s.mu.Unlock()
			if credit > 0 {
				var b [4]byte
				binary.BigEndian.PutUint32(b[:], uint32(credit))
				s.m.writeFrame(frameWindow, s.id, b[:])
			}
			return n, nil
		}
		reset, fin := s.reset, s.gotFin
		s.mu.Unlock()
		switch {
		case reset:
			return 0, errReset
		case fin:
			return 0, io.EOF
		}
		if err := s.muxErr(); err != nil {
			return 0, err
		}
		select {
		case <-s.readable:
		case <-s.m.closed:
		}
	}
}

// Write sends p, waiting for window as the other side reads.
func (s *Stream) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	written := 0
	for written < len(p) {
		s.mu.Lock()
		if s.reset {
			s.mu.Unlock()
			return written, errReset
		}
		if s.sentFin {
			s.mu.Unlock()
			return written, errors.New("write after close")
		}
		n := min(len(p)-written, s.sendWin, maxFrame)
		s.sendWin -= n
		s.mu.Unlock()
		if n == 0 {
			if err := s.muxErr(); err != nil {
				return written, err
			}
			select {
			case <-s.writable:
			case <-s.m.closed:
			}
			continue
		}
		if err := s.m.writeFrame(frameData, s.id, p[written:written+n]); err != nil {
			return written, err
		}
		written += n
	}
	return written, nil
}

// CloseWrite sends fin: the other side reads EOF once it read the rest.
func (s *Stream) CloseWrite() error {
	s.mu.Lock()
	if s.sentFin || s.reset {
		s.mu.Unlock()
		return nil
	}
	s.sentFin = true
	done := s.gotFin
	s.mu.Unlock()
	if done {
		s.m.forget(s)
	}
	return s.m.writeFrame(frameFin, s.id, nil)
}

// Close ends the stream both ways: unless both sides already sent fin, it
// sends reset, so the other side's reads and writes end too and its
// buffers for the stream go. Data received and not read is dropped.
func (s *Stream) Close() error {
	s.mu.Lock()
	both := s.sentFin && s.gotFin
	already := s.reset
	s.reset = true
	s.sentFin = true
	for _, b := range s.rq {
		s.m.pool.Put(b[:cap(b)])
	}
	s.rq, s.rqLen, s.rqOff = nil, 0, 0
	s.mu.Unlock()
	s.wake()
	s.m.forget(s)
	if both || already {
		return nil
	}
	return s.m.writeFrame(frameReset, s.id, nil)
}
