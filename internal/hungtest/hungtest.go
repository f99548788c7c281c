// Package hungtest is what tests of a hung API server share: an address
// that accepts connections and answers them as a stopped process would.
package hungtest

import (
	"bufio"
	"io"
	"net"
	"sync"
	"testing"
)

// Server stands in for an API server that hangs: it accepts
// connections (as the kernel does for a process stopped with SIGSTOP) and
// serves each as answer says, then holds it open unanswered until the test
// ends. answer gets the connection's number, from 0, and the request's
// first line; it returns what to write before holding, and whether to
// close at once instead.
func Server(t testing.TB, answer func(n int, line string) (reply string, drop bool)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				if answer == nil {
					return // not even TLS
				}
				br := bufio.NewReader(c)
				line, _ := br.ReadString('\n')
				reply, drop := answer(n, line)
				if drop {
					c.Close()
					return
				}
				c.Write([]byte(reply))
				io.Copy(io.Discard, br) // whatever comes next goes unanswered
			}()
		}
	}()
	return ln.Addr().String()
}
