package main

import (
	"context"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

// commandPaths lists every command path of node's model, parents first.
func commandPaths(node *kong.Node, prefix []string) [][]string {
	var paths [][]string
	for _, c := range node.Children {
		if c.Type != kong.CommandNode {
			continue
		}
		p := append(slices.Clone(prefix), c.Name)
		paths = append(paths, p)
		paths = append(paths, commandPaths(c, p)...)
	}
	return paths
}

// flagNames is every flag and positional argument a command takes, its
// parents' included.
func flagNames(node *kong.Node) []string {
	var names []string
	for _, group := range node.AllFlags(false) {
		for _, f := range group {
			names = append(names, "--"+f.Name)
		}
	}
	for _, p := range node.Positional {
		names = append(names, p.Name)
	}
	return names
}

// TestCutGrammarEveryCommand: for every command of the whole grammar, the
// cut grammar holds exactly that command's path, with the same flags and
// arguments, and none of its siblings.
func TestCutGrammarEveryCommand(t *testing.T) {
	whole, err := newParser(context.Background(), &CLI{}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	paths := commandPaths(whole.Model.Node, nil)
	if len(paths) < 30 {
		t.Fatalf("found %d command paths; the walk is broken", len(paths))
	}
	for _, path := range paths {
		cut, ok := cutGrammar(reflect.TypeFor[CLI](), path)
		if !ok {
			t.Errorf("%v: not cut (a command of more than one word needs a name tag)", path)
			continue
		}
		parser, err := newParser(context.Background(), reflect.New(cut).Interface(), io.Discard)
		if err != nil {
			t.Errorf("%v: %v", path, err)
			continue
		}
		cutNode, wholeNode := parser.Model.Node, whole.Model.Node
		for _, name := range path {
			if len(cutNode.Children) != 1 || cutNode.Children[0].Name != name {
				t.Errorf("%v: the cut holds %d commands at %q, want only %q", path, len(cutNode.Children), cutNode.Name, name)
				break
			}
			cutNode = cutNode.Children[0]
			wholeNode = wholeNode.Children[slices.IndexFunc(wholeNode.Children, func(n *kong.Node) bool { return n.Name == name })]
		}
		if got, want := flagNames(cutNode), flagNames(wholeNode); !slices.Equal(got, want) {
			t.Errorf("%v: the cut takes %v, the whole grammar %v", path, got, want)
		}
	}
}

// TestParseCutMatchesWhole: what a command line parses to is the same
// through the cut grammar as through the whole one, and a bad command line
// gets the whole grammar's error.
func TestParseCutMatchesWhole(t *testing.T) {
	parseWhole := func(args []string) (*kong.Context, error) {
		parser, err := newParser(context.Background(), &CLI{}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		return parser.Parse(args)
	}
	for _, args := range [][]string{
		{"version"},
		{"sandbox", "exec", "sbx_1", "--", "ls", "-la"},
		{"sandbox", "exec", "--url", "http://h:1", "sbx_1", "--", "sandbox", "create"},
		{"sandbox", "exec", "--url", "create", "sbx_1", "--", "true"},
		{"sandbox", "exec", "-t", "sbx_1", "--", "sh"},
		{"sandbox", "create", "busybox", "--cpu", "1", "--label", "a=b", "--label", "c=d", "--volume", "v:1Gi:/data"},
		{"sandbox", "list"},
		{"sandbox", "idle-timeout", "sbx_1", "10m"},
		{"key", "create", "--url", "http://h:1"},
		{"ssh-key", "list"},
		{"org", "quota", "--db", "x.db", "acme", "--max-sandboxes", "3", "--max-running", "2"},
	} {
		cutParser, cutCtx, err := parse(context.Background(), args, io.Discard)
		if err != nil {
			t.Errorf("%q: %v", args, err)
			continue
		}
		wholeCtx, err := parseWhole(args)
		if err != nil {
			t.Errorf("%q through the whole grammar: %v", args, err)
			continue
		}
		words := slices.DeleteFunc(strings.Fields(cutCtx.Command()), func(w string) bool { return strings.HasPrefix(w, "<") })
		if len(commandPaths(cutParser.Model.Node, nil)) != len(words) {
			t.Errorf("%q: parsed with a grammar of %d commands, want it cut to the path %q", args, len(commandPaths(cutParser.Model.Node, nil)), cutCtx.Command())
		}
		if cutCtx.Command() != wholeCtx.Command() {
			t.Errorf("%q: command %q, want %q", args, cutCtx.Command(), wholeCtx.Command())
		}
		if got, want := cutCtx.Selected().Target.Interface(), wholeCtx.Selected().Target.Interface(); !reflect.DeepEqual(got, want) {
			t.Errorf("%q: parsed to\n%+v\nwant\n%+v", args, got, want)
		}
	}
	for _, args := range [][]string{
		{},
		{"sandbox"},
		{"sandbox", "exc", "sbx_1"},
		{"sandbox", "exec"},
		{"sandbox", "list", "--nope"},
		{"sandbox", "create", "busybox", "--ttl"},
		{"nope"},
	} {
		_, _, err := parse(context.Background(), args, io.Discard)
		_, wholeErr := parseWhole(args)
		if err == nil || wholeErr == nil || err.Error() != wholeErr.Error() {
			t.Errorf("%q: error %v, want the whole grammar's %v", args, err, wholeErr)
		}
	}
}

func TestAsksHelp(t *testing.T) {
	for args, want := range map[string]bool{
		"sandbox --help":           true,
		"sandbox exec -h":          true,
		"--help":                   true,
		"sandbox exec x -- --help": false,
		"sandbox exec x -- ls -h":  false,
		"sandbox list":             false,
	} {
		if got := asksHelp(strings.Fields(args)); got != want {
			t.Errorf("asksHelp(%q) = %v, want %v", args, got, want)
		}
	}
}
