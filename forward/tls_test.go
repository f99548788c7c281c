package forward_test

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"sync/atomic"
	"testing"
)

// countingConn counts the writes that reach a connection.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestConnOneWritePerWrite: a Write of a Conn up to a mux frame, however
// many TLS records it takes, reaches the connection under it in one write,
// a longer one in parts, and the other end reads every byte in order.
func TestConnOneWritePerWrite(t *testing.T) {
	c, s := tcpPair(t)
	counted := &countingConn{Conn: c}
	client, server := tlsPair(t, counted, s)
	// Sizes of writes, each with the writes it should take: a mux frame
	// (64 KiB and a header) and shorter ones in one, 256 KiB in three.
	sizes := []struct {
		n      int
		writes int64
	}{{64<<10 + 9, 1}, {32 << 10, 1}, {1, 1}, {70000, 1}, {256 << 10, 3}, {5000, 1}}
	var want []byte
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(server)
		got <- b
	}()
	for range 8 {
		for _, size := range sizes {
			p := make([]byte, size.n)
			rand.Read(p)
			want = append(want, p...)
			before := counted.writes.Load()
			if _, err := client.Write(p); err != nil {
				t.Fatal(err)
			}
			if w := counted.writes.Load() - before; w != size.writes {
				t.Fatalf("a write of %d bytes took %d writes, want %d", size.n, w, size.writes)
			}
		}
	}
	client.Close()
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("read %d bytes, not the %d written", len(b), len(want))
	}
}
