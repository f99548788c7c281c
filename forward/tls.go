package forward

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Protocol is the ALPN name of the gateway's protocol to the helper: TLS
// 1.3 with a client certificate both ways, then the mux. A later,
// incompatible protocol gets a new name, so the two ends fail the
// handshake rather than misread each other.
const Protocol = "hiloop-forward/1"

// Ready is the one byte the helper sends once it accepted the gateway's
// certificate. In TLS 1.3 the client's handshake ends before the server
// has checked the client's certificate, so without it the gateway would
// learn of a refusal only at its first stream.
const Ready byte = 0x01

// Certificate makes a self-signed certificate for key, which is all either
// end checks: the helper compares the gateway's public key with the one
// it was given, the gateway pins the helper's per pod. Nothing is signed
// by an authority, and names and dates play no part.
func Certificate(key ed25519.PrivateKey) (tls.Certificate, error) {
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		NotBefore:    time.Unix(0, 0),
		NotAfter:     time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// PeerKey is the ed25519 public key of the certificate the other end
// showed.
func PeerKey(cs tls.ConnectionState) (ed25519.PublicKey, error) {
	if len(cs.PeerCertificates) == 0 {
		return nil, errors.New("no certificate")
	}
	k, ok := cs.PeerCertificates[0].PublicKey.(ed25519.PublicKey)
	if !ok {
		return nil, errors.New("not an ed25519 key")
	}
	return k, nil
}

// Fingerprint is an ed25519 public key's SHA-256 fingerprint in OpenSSH's
// form (SHA256:base64 of the key's SSH encoding), as logs and the
// helper_host_key_changed anomaly name helper keys.
func Fingerprint(k ed25519.PublicKey) string {
	// The SSH wire form: string "ssh-ed25519", string key.
	b := binary.BigEndian.AppendUint32(nil, 11)
	b = append(b, "ssh-ed25519"...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(k)))
	b = append(b, k...)
	sum := sha256.Sum256(b)
	return "SHA256:" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// EncodeOpen is the open request of a stream to host:port.
func EncodeOpen(host string, port uint32) ([]byte, error) {
	if len(host) > 255 {
		return nil, errors.New("host name too long")
	}
	b := binary.BigEndian.AppendUint32(nil, port)
	b = append(b, byte(len(host)))
	return append(b, host...), nil
}

// DecodeOpen is EncodeOpen's inverse.
func DecodeOpen(b []byte) (host string, port uint32, err error) {
	if len(b) < 5 || len(b) != 5+int(b[4]) {
		return "", 0, errors.New("malformed open request")
	}
	return string(b[5:]), binary.BigEndian.Uint32(b), nil
}

// ErrOldHelper is a helper that answered in SSH: one started before the
// gateway moved to this protocol, which speaks only SSH.
var ErrOldHelper = errors.New("the sandbox's session helper is older than the gateway; restart the sandbox")

// ErrRefused is a helper that refused the gateway's certificate: a key it
// does not hold for its sandbox, or another sandbox's name.
var ErrRefused = errors.New("the session helper refused the gateway")

// ServerConfig is the helper's side: its certificate, a client certificate
// required, TLS 1.3 only, and verify deciding on each client. Session
// tickets are off: every connection authenticates afresh.
func ServerConfig(cert tls.Certificate, verify func(tls.ConnectionState) error) *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		Certificates:           []tls.Certificate{cert},
		ClientAuth:             tls.RequireAnyClientCert,
		NextProtos:             []string{Protocol},
		SessionTicketsDisabled: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if cs.NegotiatedProtocol != Protocol {
				return errors.New("not the forward protocol")
			}
			return verify(cs)
		},
	}
}

// ClientConfig is the gateway's side toward the helper of sandboxID: the
// certificate of key (the key derived for that sandbox), the sandbox id as
// the server name, which the helper checks against its own, and verify
// deciding on the helper's public key (the pin).
func ClientConfig(sandboxID string, key ed25519.PrivateKey, verify func(ed25519.PublicKey) error) (*tls.Config, error) {
	cert, err := Certificate(key)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ServerName:   sandboxID,
		NextProtos:   []string{Protocol},
		// No authority vouches for a helper; VerifyConnection pins its key.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if cs.NegotiatedProtocol != Protocol {
				return errors.New("the helper does not speak " + Protocol)
			}
			k, err := PeerKey(cs)
			if err != nil {
				return err
			}
			return verify(k)
		},
	}, nil
}

// Handshake runs the gateway's side of the handshake on c and waits for
// the helper's Ready, so a refused certificate is known here (ErrRefused)
// rather than at the first stream. A helper that greets in SSH is
// ErrOldHelper. The caller bounds it by closing c.
func Handshake(c net.Conn, cfg *tls.Config) (*Conn, error) {
	tc := Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		return nil, oldHelper(err)
	}
	var b [1]byte
	if _, err := io.ReadFull(tc, b[:]); err != nil {
		if err := oldHelper(err); errors.Is(err, ErrOldHelper) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	if b[0] != Ready {
		return nil, errors.New("the session helper sent no ready")
	}
	return tc, nil
}

// oldHelper turns the error of a TLS client that read an SSH version line
// ("SSH-2.0-...") instead of a TLS record into ErrOldHelper.
func oldHelper(err error) error {
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) && bytes.HasPrefix(rh.RecordHeader[:], []byte("SSH-")) {
		return ErrOldHelper
	}
	return err
}

// Conn is a TLS connection whose every Write of up to a mux frame reaches
// the connection under it in one write. crypto/tls writes each record,
// 16 KiB at most, with a write of its own, so a mux frame of 64 KiB would
// take five system calls, a large part of what a -L push costs the gateway
// (docs/benchmarks.md, SSH).
//
// It keeps crypto/tls's promises for writes: a Write returns once its
// records are written (one Write at a time, so none returns with records
// of its own still kept for another's end), every write fails once one
// failed, and Close ends a Write waiting on a peer that stopped reading.
type Conn struct {
	*tls.Conn
	under   *gatherConn
	wmu     sync.Mutex
	writing atomic.Bool
}

// Client is tls.Client on c, as a Conn.
func Client(c net.Conn, cfg *tls.Config) *Conn {
	g := &gatherConn{Conn: c}
	return &Conn{Conn: tls.Client(g, cfg), under: g}
}

// Server is tls.Server on c, as a Conn.
func Server(c net.Conn, cfg *tls.Config) *Conn {
	g := &gatherConn{Conn: c}
	return &Conn{Conn: tls.Server(g, cfg), under: g}
}

// Write writes p as TLS records, gathered into one write.
func (c *Conn) Write(p []byte) (int, error) {
	// A handshake still to run runs first, its messages written as they
	// come: kept for this Write's end, they would wait on the answer to
	// themselves.
	if err := c.Conn.Handshake(); err != nil {
		return 0, err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.writing.Store(true)
	defer c.writing.Store(false)
	c.under.gather()
	n, err := c.Conn.Write(p)
	if ferr := c.under.flush(); ferr != nil && err == nil {
		return 0, ferr
	}
	return n, err
}

// Close closes the connection, with a close_notify unless a Write is in
// flight: that Write may wait on a peer that stopped reading, and the
// close_notify would wait behind it (up to the 5 s crypto/tls gives it),
// so the connection under it is closed at once, as crypto/tls does for a
// Write of its own.
func (c *Conn) Close() error {
	if c.writing.Load() {
		err := c.under.Conn.Close()
		c.Conn.Close() // later calls fail with net.ErrClosed
		return err
	}
	return c.Conn.Close()
}

// gatherConn keeps what is written to it while gathering and writes it at
// flush, or once gatherMax bytes wait; other writes (the handshake's,
// alerts) go straight through. Writes keep their order either way. The
// first write that fails fails every later one: what was lost or cut short
// leaves a stream of records the other end cannot decrypt.
type gatherConn struct {
	net.Conn
	mu        sync.Mutex
	gathering bool
	buf       []byte
	err       error
}

func (g *gatherConn) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return 0, g.err
	}
	if !g.gathering {
		return g.write(p)
	}
	g.buf = append(g.buf, p...)
	if len(g.buf) < gatherMax {
		return len(p), nil
	}
	// A long write goes out in parts, so the other end decrypts the
	// first while this end encrypts the rest.
	_, err := g.write(g.buf)
	g.buf = g.buf[:0]
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// write writes b to the connection under g, keeping its error for good.
func (g *gatherConn) write(b []byte) (int, error) {
	n, err := g.Conn.Write(b)
	if err != nil {
		g.err = err
	}
	return n, err
}

// gatherMax is how much a Conn gathers before it writes: a mux frame
// (64 KiB and a header) in one write, longer writes in parts of about this.
const gatherMax = 96 << 10

func (g *gatherConn) gather() {
	g.mu.Lock()
	g.gathering = true
	g.mu.Unlock()
}

// flush ends the gather and writes what was kept.
func (g *gatherConn) flush() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gathering = false
	if len(g.buf) == 0 {
		return nil
	}
	if g.err != nil {
		g.buf = g.buf[:0]
		return g.err
	}
	_, err := g.write(g.buf)
	g.buf = g.buf[:0]
	return err
}
