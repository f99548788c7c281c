package forward_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/hiloop/hiloop/forward"
	"github.com/hiloop/hiloop/internal/tlstest"
)

// helperOn serves one TLS connection on 127.0.0.1:0 with cfg, writing the
// ready byte once its handshake is done, and returns the address.
func helperOn(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		tc := tls.Server(c, cfg)
		if tc.Handshake() == nil {
			tc.Write([]byte{forward.Ready})
			tc.Read(make([]byte, 1))
		}
	}()
	return ln.Addr().String()
}

func gatewayDial(t *testing.T, addr string, cfg *tls.Config) error {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	tc, err := forward.Handshake(c, cfg)
	if err == nil {
		tc.Close()
	}
	return err
}

func edKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestGatewayRefusesHelpers: the gateway's side of the handshake refuses a
// helper that offers TLS 1.2 only, shows an ECDSA key, does not speak the
// forward protocol, or shows a key the pin refuses, although it verifies
// no chain (InsecureSkipVerify): VerifyConnection runs all the same. It
// keeps no sessions to resume.
func TestGatewayRefusesHelpers(t *testing.T) {
	gwKey, helperKey := edKey(t), edKey(t)
	pinned := func(want ed25519.PublicKey) func(ed25519.PublicKey) error {
		return func(k ed25519.PublicKey) error {
			if !k.Equal(want) {
				return errors.New("not the pinned key")
			}
			return nil
		}
	}
	cfg, err := forward.ClientConfig("sbx_a", gwKey, pinned(helperKey.Public().(ed25519.PublicKey)))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MinVersion != tls.VersionTLS13 || cfg.ClientSessionCache != nil || cfg.ServerName != "sbx_a" {
		t.Errorf("client config: min version %x, session cache %v, server name %q", cfg.MinVersion, cfg.ClientSessionCache, cfg.ServerName)
	}
	cert, err := forward.Certificate(helperKey)
	if err != nil {
		t.Fatal(err)
	}
	accept := func(tls.ConnectionState) error { return nil }
	good := forward.ServerConfig(cert, accept)
	if good.MinVersion != tls.VersionTLS13 || !good.SessionTicketsDisabled || good.ClientAuth != tls.RequireAnyClientCert {
		t.Errorf("server config: min version %x, tickets disabled %v, client auth %v", good.MinVersion, good.SessionTicketsDisabled, good.ClientAuth)
	}
	if err := gatewayDial(t, helperOn(t, good), cfg); err != nil {
		t.Fatalf("the pinned helper: %v", err)
	}

	tls12 := good.Clone()
	tls12.MinVersion, tls12.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	ecdsaCert := good.Clone()
	ecdsaCert.Certificates = []tls.Certificate{tlstest.ECDSACertificate(t)}
	noProto := good.Clone()
	noProto.NextProtos = nil
	noProto.VerifyConnection = nil
	other, err := forward.Certificate(edKey(t))
	if err != nil {
		t.Fatal(err)
	}
	otherKey := good.Clone()
	otherKey.Certificates = []tls.Certificate{other}
	// The pinned helper's certificate sent by a holder of another key:
	// the CertificateVerify does not check out.
	stolen := good.Clone()
	stolen.Certificates = []tls.Certificate{{Certificate: cert.Certificate, PrivateKey: other.PrivateKey}}
	for name, c := range map[string]*tls.Config{
		"TLS 1.2 only": tls12, "an ECDSA key": ecdsaCert, "no forward protocol": noProto,
		"another key": otherKey, "the pinned certificate without its key": stolen,
	} {
		if err := gatewayDial(t, helperOn(t, c), cfg); err == nil {
			t.Errorf("a helper with %s was accepted", name)
		}
	}
}
