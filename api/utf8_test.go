package api_test

import (
	"errors"
	"testing"

	"github.com/hiloop/hiloop/api"
)

// TestRunAndExecRefuseNotUTF8: JSON would turn bytes that are not UTF-8
// into U+FFFD without a word, so the client refuses a command line, env
// (a create's too) or cwd that holds them, as the server refuses them in a URL, before
// anything is sent (nothing listens at the client's URL).
func TestRunAndExecRefuseNotUTF8(t *testing.T) {
	c := &api.Client{URL: "http://127.0.0.1:1", Token: "t"}
	for _, tc := range []struct {
		name        string
		command     []string
		env         map[string]string
		cwd         string
		code, field string
	}{
		{"argument", []string{"echo", "\xff"}, nil, "", api.CodeInvalidField, "command"},
		{"env value", []string{"true"}, map[string]string{"A": "ok", "B": "x\xe4\xb8"}, "", api.CodeInvalidEnv, "env.B"},
		{"env name", []string{"true"}, map[string]string{"\xff": "x"}, "", api.CodeInvalidEnv, "env"},
		{"cwd", []string{"true"}, nil, "/tmp/\xc3", api.CodeInvalidPath, "cwd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check := func(how string, err error) {
				t.Helper()
				var e *api.Error
				if !errors.As(err, &e) || e.Status != 400 || e.Code != tc.code || e.Field != tc.field {
					t.Errorf("%s: %v, want 400 %s naming %s", how, err, tc.code, tc.field)
				}
			}
			_, err := c.Run(t.Context(), "sbx_aaaaaaaaaaaaaaaa", api.ExecRunRequest{Command: tc.command, Env: tc.env, Cwd: tc.cwd})
			check("Run", err)
			_, err = c.Exec(t.Context(), "sbx_aaaaaaaaaaaaaaaa", api.ExecOptions{Command: tc.command, Env: tc.env, Cwd: tc.cwd})
			check("Exec", err)
			if tc.env != nil {
				_, err = c.CreateSandbox(t.Context(), api.CreateSandboxRequest{Image: "busybox", Env: tc.env}, "")
				check("CreateSandbox", err)
			}
		})
	}
}
