package main

import (
	"context"
	"io"
	"reflect"
	"strings"

	"github.com/alecthomas/kong"
)

// Building kong's model of the whole grammar takes longer than most
// commands run: it reflects over every command's flags and interpolates
// every help string, and the garbage it makes brings on the GC
// (docs/benchmarks.md, exec round trip). A command run by name needs only
// its own path, so parse first builds the grammar cut down to the commands
// args name, and falls back to the whole grammar for help, for no command, and
// for any parse error. Users see exactly what the whole grammar would give
// them: a cut grammar holds the one command path args select, with every
// flag and argument of the commands on it, and only the commands off that
// path are left out, which a successful parse never visits.

// parse parses args (without the program name) against the grammar of CLI.
// The parser returned is the one whose model the context belongs to.
func parse(ctx context.Context, args []string, stdout io.Writer) (*kong.Kong, *kong.Context, error) {
	if !asksHelp(args) {
		if cut, ok := cutGrammar(reflect.TypeFor[CLI](), args); ok {
			grammar := reflect.New(cut).Interface()
			if parser, err := newParser(ctx, grammar, stdout); err == nil {
				if kctx, err := parser.Parse(args); err == nil {
					return parser, kctx, nil
				}
			}
		}
	}
	parser, err := newParser(ctx, &CLI{}, stdout)
	if err != nil {
		return nil, nil, err
	}
	kctx, err := parser.Parse(args)
	return parser, kctx, err
}

// asksHelp reports whether args ask for help before any "--".
func asksHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "--help":
			return true
		}
	}
	return false
}

// cutGrammar returns a struct type like t with, at every level, only the
// command args name next, and reports whether it cut anything. A level
// whose next positional argument names none of its commands is kept whole,
// as is one that holds anything but commands.
func cutGrammar(t reflect.Type, args []string) (reflect.Type, bool) {
	name, rest, ok := nextWord(args)
	if !ok {
		return t, false
	}
	var chosen *reflect.StructField
	for i := range t.NumField() {
		f := t.Field(i)
		if _, isCmd := f.Tag.Lookup("cmd"); !isCmd || f.Anonymous || f.Type.Kind() != reflect.Struct {
			return t, false
		}
		if commandName(f) == name {
			chosen = &f
		}
	}
	if chosen == nil {
		return t, false
	}
	if sub, ok := cutGrammar(chosen.Type, rest); ok {
		chosen.Type = sub
	}
	return reflect.StructOf([]reflect.StructField{*chosen}), true
}

// nextWord returns the first argument that is not a flag, and what follows
// it; none after "--".
func nextWord(args []string) (string, []string, bool) {
	for i, a := range args {
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			return a, args[i+1:], true
		}
	}
	return "", nil, false
}

// commandName is the name kong gives a command field: its name tag, or its
// field name in lower case (a command of more than one word needs a name
// tag; TestCutGrammarEveryCommand finds one that lacks it).
func commandName(f reflect.StructField) string {
	if n := f.Tag.Get("name"); n != "" {
		return n
	}
	return strings.ToLower(f.Name)
}
