package boundary

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	admissionv1 "k8s.io/api/admissionregistration/v1"
)

// The self-check compares the admission policies and bindings with the
// chart's rendering field by field, as the API server stores them: both
// sides get the defaults the API server fills in, and a field that is
// absent, null or empty is the same as one that is not there. A field the
// chart does not render (matchConditions, an objectSelector, a paramRef,
// excludeResourceRules, another variable) is a difference like any other.

// defaultPolicy fills in what the API server defaults in a policy's spec.
func defaultPolicy(s *admissionv1.ValidatingAdmissionPolicySpec) {
	if s.FailurePolicy == nil {
		fail := admissionv1.Fail
		s.FailurePolicy = &fail
	}
	defaultMatch(s.MatchConstraints)
}

// defaultMatch fills in what the API server defaults in match resources.
func defaultMatch(m *admissionv1.MatchResources) {
	if m == nil {
		return
	}
	if m.MatchPolicy == nil {
		eq := admissionv1.Equivalent
		m.MatchPolicy = &eq
	}
	for _, rules := range [][]admissionv1.NamedRuleWithOperations{m.ResourceRules, m.ExcludeResourceRules} {
		for i := range rules {
			if rules[i].Scope == nil {
				all := admissionv1.AllScopes
				rules[i].Scope = &all
			}
		}
	}
}

// specDiff lists up to three paths where have differs from want, each with
// both values, after a JSON round trip that drops empty fields.
func specDiff(have, want any) []string {
	h, w := normalized(have), normalized(want)
	var out []string
	diffValues("spec", h, w, &out)
	if len(out) > 3 {
		out = append(out[:3], fmt.Sprintf("and %d more", len(out)-3))
	}
	return out
}

func normalized(v any) any {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("(unencodable: %v)", err)
	}
	var out any
	if err := json.Unmarshal(raw, &out); err != nil {
		return fmt.Sprintf("(undecodable: %v)", err)
	}
	return prune(out)
}

// prune drops nulls, empty strings, empty maps and empty lists, from the
// leaves up; false and 0 stay.
func prune(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			if x = prune(x); x == nil {
				delete(t, k)
			} else {
				t[k] = x
			}
		}
		if len(t) == 0 {
			return nil
		}
		return t
	case []any:
		out := t[:0]
		for _, x := range t {
			// A list entry keeps its place even when empty.
			if x = prune(x); x == nil {
				x = map[string]any{}
			}
			out = append(out, x)
		}
		if len(out) == 0 {
			return nil
		}
		return out
	case string:
		if t == "" {
			return nil
		}
	}
	return v
}

func diffValues(path string, have, want any, out *[]string) {
	if len(*out) > 10 {
		return
	}
	hm, hok := have.(map[string]any)
	wm, wok := want.(map[string]any)
	if hok && wok {
		keys := map[string]bool{}
		for k := range hm {
			keys[k] = true
		}
		for k := range wm {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			diffValues(path+"."+k, hm[k], wm[k], out)
		}
		return
	}
	hl, hok := have.([]any)
	wl, wok := want.([]any)
	if hok && wok && len(hl) == len(wl) {
		for i := range hl {
			diffValues(fmt.Sprintf("%s[%d]", path, i), hl[i], wl[i], out)
		}
		return
	}
	if hok && wok {
		*out = append(*out, fmt.Sprintf("%s has %d entries, the chart's %d", path, len(hl), len(wl)))
		return
	}
	h, _ := json.Marshal(have)
	w, _ := json.Marshal(want)
	if string(h) == string(w) {
		return
	}
	*out = append(*out, fmt.Sprintf("%s is %s, the chart's %s", path, short(have), short(want)))
}

// short is a value for a message: JSON, cut at 80 characters; absent for nil.
func short(v any) string {
	if v == nil {
		return "absent"
	}
	b, _ := json.Marshal(v)
	s := string(b)
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return strings.ReplaceAll(s, "\n", " ")
}
