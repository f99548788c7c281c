// Package migrations holds the product record's schema as numbered SQL files,
// embedded into the binary. store.Open applies them in order.
package migrations

import "embed"

// FS holds every migration, named NNNN_description.sql.
//
//go:embed *.sql
var FS embed.FS
