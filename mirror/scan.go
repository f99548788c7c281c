package mirror

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// A scan of JSON that finds where values end without decoding them: it
// looks at quotes and brackets only, and finds the end of a string with
// bytes.IndexByte. It checks the structure it walks through (brackets that
// match, members as "key": value), not the values it skips; the members
// that are then decoded, by encoding/json, are checked in full.

// errShort says the input ends within a value: more of the stream is needed.
var errShort = errors.New("json value not complete")

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// skipSpace returns the index of the first byte of b from i on that is not
// JSON white space, or len(b).
func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// skipString returns the index just past the string that starts at b[i]
// (a quote), or errShort.
func skipString(b []byte, i int) (int, error) {
	i++
	for {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return 0, errShort
		}
		i += q
		// The quote ends the string unless an odd number of backslashes
		// escape it.
		n := 0
		for j := i - 1; j >= 0 && b[j] == '\\'; j-- {
			n++
		}
		i++
		if n%2 == 0 {
			return i, nil
		}
	}
}

// skipValue returns the index just past the JSON value that starts at b[i],
// errShort when b ends within it, or an error when b[i] cannot start a
// value or brackets do not match.
func skipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, errShort
	}
	switch c := b[i]; c {
	case '"':
		return skipString(b, i)
	case '{', '[':
		// The brackets open within it, innermost last.
		stack := make([]byte, 0, 16)
		for i < len(b) {
			switch c := b[i]; c {
			case '"':
				end, err := skipString(b, i)
				if err != nil {
					return 0, err
				}
				i = end
				continue
			case '{', '[':
				stack = append(stack, c)
			case '}', ']':
				if len(stack) == 0 || stack[len(stack)-1] != c-2 { // '{'+2 == '}', '['+2 == ']'
					return 0, fmt.Errorf("json: unexpected %q at offset %d", c, i)
				}
				stack = stack[:len(stack)-1]
				if len(stack) == 0 {
					return i + 1, nil
				}
			}
			i++
		}
		return 0, errShort
	default:
		// A number, true, false or null: up to the next delimiter.
		start := i
		for i < len(b) && !isSpace(b[i]) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ':' {
			i++
		}
		if i == start {
			return 0, fmt.Errorf("json: unexpected %q at offset %d", c, i)
		}
		if i == len(b) {
			return 0, errShort
		}
		return i, nil
	}
}

// members calls fn with the key and the raw value of each member of the
// JSON object obj, in order, and returns the first error fn returns.
func members(obj []byte, fn func(key, v []byte) error) error {
	_, err := walk(obj, skipSpace(obj, 0), func(key, b []byte, i int) (int, error) {
		end, err := skipValue(b, i)
		if err != nil {
			return 0, err
		}
		return end, fn(key, b[i:end])
	})
	return err
}

// walk calls fn with the key of each member of the JSON object that starts
// at obj[i], in order, and obj and the index where the member's value
// starts; fn returns the index just past the value, so that it can read
// the value as it skips it (see keptMembers), and each byte is scanned
// once. walk returns the index just past the object.
func walk(obj []byte, i int, fn func(key, b []byte, i int) (int, error)) (int, error) {
	if i >= len(obj) || obj[i] != '{' {
		return 0, errors.New("json: not an object")
	}
	i = skipSpace(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return i + 1, nil
	}
	for {
		if i >= len(obj) || obj[i] != '"' {
			return 0, fmt.Errorf("json: want a key at offset %d", i)
		}
		end, err := skipString(obj, i)
		if err != nil {
			return 0, fmt.Errorf("json: key at offset %d: %w", i, err)
		}
		key := obj[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			var k string
			if err := json.Unmarshal(obj[i:end], &k); err != nil {
				return 0, err
			}
			key = []byte(k)
		}
		i = skipSpace(obj, end)
		if i >= len(obj) || obj[i] != ':' {
			return 0, fmt.Errorf("json: want ':' at offset %d", i)
		}
		i = skipSpace(obj, i+1)
		if i >= len(obj) {
			return 0, fmt.Errorf("json: value at offset %d: %w", i, errShort)
		}
		vend, err := fn(key, obj, i)
		if err != nil {
			return 0, fmt.Errorf("json: value at offset %d: %w", i, err)
		}
		i = skipSpace(obj, vend)
		if i >= len(obj) {
			return 0, errors.New("json: object not closed")
		}
		switch obj[i] {
		case ',':
			i = skipSpace(obj, i+1)
		case '}':
			return i + 1, nil
		default:
			return 0, fmt.Errorf("json: want ',' or '}' at offset %d", i)
		}
	}
}
