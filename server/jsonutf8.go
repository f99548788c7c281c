package server

import (
	"errors"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// jsonUTF8 refuses a JSON body that is not UTF-8 text: raw bytes that
// are not UTF-8, or a \u escape of a lone surrogate (what Python's json
// writes for a file name it read as bytes). encoding/json would decode
// either to U+FFFD without a word, so a path would name another file.
func jsonUTF8(body []byte) error {
	if !utf8.Valid(body) {
		return errors.New("the body is not valid UTF-8")
	}
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		i++ // the escaped character; a \\ is skipped whole
		r, ok := escapedRune(body, i)
		if !ok {
			continue
		}
		i += 4
		switch {
		case utf16.IsSurrogate(r) && r < 0xdc00:
			if r2, ok := escapedRune(body, i+2); i+1 < len(body) && body[i+1] == '\\' && ok && r2 >= 0xdc00 && r2 <= 0xdfff {
				i += 6
				continue
			}
			return errors.New("the body escapes a lone surrogate (\\u" + strconv.FormatInt(int64(r), 16) + "), which is no character")
		case utf16.IsSurrogate(r):
			return errors.New("the body escapes a lone surrogate (\\u" + strconv.FormatInt(int64(r), 16) + "), which is no character")
		}
	}
	return nil
}

// escapedRune reads the 4 hex digits of a \u escape whose u is body[i].
func escapedRune(body []byte, i int) (rune, bool) {
	if i+4 >= len(body) || body[i] != 'u' {
		return 0, false
	}
	n, err := strconv.ParseUint(string(body[i+1:i+5]), 16, 16)
	return rune(n), err == nil
}
