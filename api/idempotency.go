package api

import (
	"crypto/rand"
	"encoding/hex"
)

// NewIdempotencyKey returns a random Idempotency-Key: 128 bits, hex.
func NewIdempotencyKey() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}
