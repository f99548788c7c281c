package api_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/hiloop/hiloop/api"
)

// A sandbox from creation to deletion: create it and wait until it runs,
// run a command, delete it. NewClient takes the URL and key from HILOOP_URL
// and HILOOP_TOKEN.
func Example() {
	ctx := context.Background()
	c := api.NewClient("", "")
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "hiloop.local/python:3.11", TTL: "1h"}, "")
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, sb.ID)
	if sb, err = c.Wait(ctx, sb.ID, api.StateRunning); err != nil {
		log.Fatal(err)
	}
	res, err := c.Run(ctx, sb.ID, api.ExecRunRequest{Command: []string{"python3", "-c", "print(6*7)"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
}

// Exec streams a command's output as it comes and returns its exact exit
// code.
func ExampleClient_Exec() {
	ctx := context.Background()
	c := api.NewClient("", "")
	st, err := c.Exec(ctx, "sbx_...", api.ExecOptions{
		Command: []string{"sh", "-c", "for i in 1 2 3; do echo $i; sleep 1; done; exit 3"},
		Stdout:  os.Stdout,
		Stderr:  os.Stderr,
		Timeout: time.Minute,
	})
	switch {
	case api.ErrorCode(err) == api.CodeExecTimeout:
		fmt.Println("timed out")
	case errors.Is(err, api.ErrNoExitFrame):
		fmt.Println("connection lost; the command's fate is unknown")
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Println("exit", st.Code, st.Signal)
	}
}

// Run runs a one-shot command; a command past its timeout answers
// TimedOut rather than an error.
func ExampleClient_Run() {
	ctx := context.Background()
	c := api.NewClient("", "")
	res, err := c.Run(ctx, "sbx_...", api.ExecRunRequest{Command: []string{"sleep", "10"}, Timeout: "1s"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.TimedOut)
}

// Sandboxes walks every page of a list.
func ExampleClient_Sandboxes() {
	ctx := context.Background()
	c := api.NewClient("", "")
	for sb, err := range c.Sandboxes(ctx, api.ListOptions{State: api.StateRunning, Labels: map[string]string{"team": "a"}}) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(sb.ID)
	}
}

// Every refusal of the API is an *Error with a stable code and the
// request's id.
func ExampleError() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"error":{"code":"not_found","message":"no such sandbox","request_id":"req_1"}}`)
	}))
	defer srv.Close()

	c := api.NewClient(srv.URL, "hl_example")
	_, err := c.Sandbox(context.Background(), "sbx_gone")
	var apiErr *api.Error
	if errors.As(err, &apiErr) {
		fmt.Println(apiErr.Status, apiErr.Code, apiErr.RequestID)
	}
	// Output: 404 not_found req_1
}
