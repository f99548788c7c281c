//go:build tools

// Package tools pins helm, used by the tests to lint and render the chart.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
