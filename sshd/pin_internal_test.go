package sshd

import "testing"

// TestPinQuestionsPerKey: a dial of another key never waits on, and so
// never takes the answer of, a question asked with the pinned key. (Were
// it to, its key would be refused without ever being put to the record,
// and the change never recorded.) A dial of the same key shares the
// question under way.
func TestPinQuestionsPerKey(t *testing.T) {
	const pod, k1, k2 = "uid-pod", "SHA256:k1", "SHA256:k2"
	var p pins
	a1, first := p.ask(pod, k1)
	if !first {
		t.Fatal("the pod's first question is not first")
	}
	if a, first := p.ask(pod, k1); first || a != a1 {
		t.Error("a dial of the same key did not share the question under way")
	}
	a2, first := p.ask(pod, k2)
	if !first || a2 == a1 {
		t.Fatal("a dial of another key joined the question asked with the first")
	}
	p.answered(a1, k1, nil)
	p.answered(a2, k1, nil)
	if len(p.asked) != 0 {
		t.Errorf("%d questions left once every one was answered", len(p.asked))
	}
}
