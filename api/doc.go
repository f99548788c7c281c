// Package api is hiloop's API contract and its Go client: every request
// and response body, the error codes and the error envelope, the framing of
// the streaming exec, and Client, which calls them with a context,
// retries what the server asks to be retried, and reports the API's
// answers as *Error.
//
// It depends on no other package of hiloop's, so a program that drives
// sandboxes links only this package and its one dependency (a WebSocket
// library) and not the server.
package api
