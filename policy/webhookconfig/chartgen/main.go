// Command chartgen writes the Helm template of the chart's two webhook
// configurations from webhookconfig.Configurations, so that the chart and
// `webhook configurations` build the same objects from one piece of Go.
//
// It builds the configurations with a sentinel for every value the chart
// sets and every part present (every write routed, a caBundle, a
// break-glass group, an excluded namespace, an extra selector), and once
// more for each part left out. The YAML of the first build becomes the
// template: each sentinel is replaced by the chart's input, and the lines
// that another build lacks are wrapped in the `if` that keeps them
// (nested in the order of variants). Nothing of the
// objects' shape is written here; test/chart renders the chart and
// compares it with the command's output for the same settings.
//
//	go run ./policy/webhookconfig/chartgen -out charts/stampguard/templates/webhook/_configurations.tpl
package main

import (
	"bytes"
	"encoding/base64"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/webhookconfig"
)

// Sentinels: values no real setting has, each replaced by one input.
const (
	sName      = "sg-sentinel-cfg"
	sNamespace = "sg-sentinel-namespace"
	sService   = "sg-sentinel-service"
	sPort      = 65099
	sTimeout   = 29
	sStampFP   = "SG-SENTINEL-STAMP"
	sFieldsFP  = "SG-SENTINEL-FIELDS"
	sBreak     = "sg-sentinel:break-glass"
	sExcluded  = "sg-sentinel-excluded"
	sLabel     = "sg-sentinel-label"
	sExpr      = "sg-sentinel-expr"
	sGroup     = "sg-sentinel-group"
	sResource  = "sg-sentinel-resource"
)

var sCA = []byte("sg-sentinel-ca")

func base() webhookconfig.ConfigOptions {
	port := int32(sPort)
	return webhookconfig.ConfigOptions{
		Name:                sName,
		Service:             &admissionregistrationv1.ServiceReference{Namespace: sNamespace, Name: sService, Port: &port},
		CABundle:            sCA,
		StampFailurePolicy:  sStampFP,
		FieldsFailurePolicy: sFieldsFP,
		TimeoutSeconds:      sTimeout,
		Resources:           []webhookconfig.GuardedResource{{Group: sGroup, Resource: sResource}},
		NamespaceSelector: &metav1.LabelSelector{
			MatchLabels:      map[string]string{sLabel: "v"},
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: sExpr, Operator: metav1.LabelSelectorOpExists}},
		},
		ExcludedNamespaces: []string{sExcluded},
		BreakGlassGroup:    sBreak,
		RouteAll:           true,
	}
}

// variant is one optional part: the condition under which the base's
// lines stay, and the options without the part.
type variant struct {
	cond string // true when the base's lines apply
	opts func(*webhookconfig.ConfigOptions)
}

// In this order the conditions nest: routeAll outermost.
var variants = []variant{
	{"$.routeAll", func(o *webhookconfig.ConfigOptions) { o.RouteAll = false }},
	{"$.caBundle", func(o *webhookconfig.ConfigOptions) { o.CABundle = nil }},
	{`ne $.breakGlassGroup "-"`, func(o *webhookconfig.ConfigOptions) { o.BreakGlassGroup = "-" }},
	{"$.excludedNamespaces", func(o *webhookconfig.ConfigOptions) { o.ExcludedNamespaces = []string{} }},
	{"$.matchLabels", func(o *webhookconfig.ConfigOptions) { o.NamespaceSelector.MatchLabels = nil }},
	{"$.matchExpressions", func(o *webhookconfig.ConfigOptions) { o.NamespaceSelector.MatchExpressions = nil }},
}

// negate is the condition of the lines only the variant has.
func negate(cond string) string {
	if rest, ok := strings.CutPrefix(cond, "not "); ok {
		return rest
	}
	return "not (" + cond + ")"
}

func render(o webhookconfig.ConfigOptions) []string {
	mut, val := webhookconfig.Configurations(o)
	var b bytes.Buffer
	for _, obj := range []any{mut, val} {
		y, err := yaml.Marshal(obj)
		if err != nil {
			fail(err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	return strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
}

type insertion struct {
	cond  string
	lines []string
}

func main() {
	out := flag.String("out", "", "file to write the template to")
	flag.Parse()
	if *out == "" {
		fail(fmt.Errorf("-out is required"))
	}
	lines := render(base())
	conds := make([][]string, len(lines))
	inserts := map[int][]insertion{}
	for _, v := range variants {
		o := base()
		o.NamespaceSelector = o.NamespaceSelector.DeepCopy()
		v.opts(&o)
		for _, h := range diff(lines, render(o)) {
			for i := h.at; i < h.at+h.removed; i++ {
				conds[i] = append(conds[i], v.cond)
			}
			if len(h.added) > 0 {
				inserts[h.at] = append(inserts[h.at], insertion{negate(v.cond), h.added})
			}
		}
	}

	var b strings.Builder
	var prev string
	b.WriteString(header)
	b.WriteString(`{{- define "stampguard.webhook.configurations" }}` + "\n")
	// open holds the conditions of the ifs open now, with their indents.
	var open []string
	var indents []string
	closeTo := func(depth int) {
		for len(open) > depth {
			b.WriteString(indents[len(indents)-1] + "{{- end }}\n")
			open, indents = open[:len(open)-1], indents[:len(indents)-1]
		}
	}
	line := func(cs []string, l string) {
		common := 0
		for common < len(open) && common < len(cs) && open[common] == cs[common] {
			common++
		}
		closeTo(common)
		for _, c := range cs[common:] {
			b.WriteString(indent(l) + "{{- if " + c + " }}\n")
			open, indents = append(open, c), append(indents, indent(l))
		}
		b.WriteString(substitute(l, &prev))
	}
	for i := 0; i <= len(lines); i++ {
		for _, ins := range inserts[i] {
			closeTo(0) // an insertion's condition is never nested
			for _, l := range ins.lines {
				line([]string{ins.cond}, l)
			}
			closeTo(0)
		}
		if i == len(lines) {
			break
		}
		line(conds[i], lines[i])
	}
	closeTo(0)
	b.WriteString("{{- end }}\n")
	if err := os.WriteFile(*out, []byte(b.String()), 0o644); err != nil {
		fail(err)
	}
}

const header = `{{- /*
Code generated by go run ./policy/webhookconfig/chartgen (make generate); DO NOT EDIT.

The two webhook configurations, exactly as webhookconfig.Configurations
builds them (policy/webhookconfig/config.go). configurations.yaml calls
this with a dict of the options:
  name, namespace, service, port, caBundle (base64, or empty),
  stampFailurePolicy, fieldsFailurePolicy, timeoutSeconds, breakGlassGroup,
  excludedNamespaces, matchLabels, matchExpressions (the extra namespace
  selector), routeAll, resources (list of {group, resource}),
  labels, annotations (of both objects).
*/ -}}
`

const metadataExtras = `  {{- with $.labels }}
  labels:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
`

// substitute replaces the sentinels of one YAML line with the inputs.
func substitute(l string, prev *string) string {
	ind := indent(l)
	t := strings.TrimSpace(l)
	defer func() { *prev = t }()
	switch t {
	case "name: " + sName:
		if ind == "  " { // metadata.name: the chart's labels and annotations follow
			return ind + "name: {{ $.name | toJson }}\n" + metadataExtras
		}
	case "port: " + strconv.Itoa(sPort):
		return ind + "port: {{ $.port }}\n"
	case "timeoutSeconds: " + strconv.Itoa(sTimeout):
		return ind + "timeoutSeconds: {{ $.timeoutSeconds }}\n"
	case "caBundle: " + base64.StdEncoding.EncodeToString(sCA):
		return ind + "caBundle: {{ $.caBundle }}\n"
	case "- " + sExcluded:
		return ind + "{{- range $.excludedNamespaces }}\n" + ind + "- {{ . | toJson }}\n" + ind + "{{- end }}\n"
	case sLabel + ": v":
		return ind + "{{- range $k, $v := $.matchLabels }}\n" + ind + "{{ $k | toJson }}: {{ $v | toJson }}\n" + ind + "{{- end }}\n"
	case "- key: " + sExpr:
		return ind + "{{- range $.matchExpressions }}\n" + ind + "- {{ toJson . }}\n" + ind + "{{- end }}\n"
	case "operator: Exists":
		if *prev == "- key: "+sExpr { // the sentinel expression's second line
			return ""
		}
	case "- apiGroups:":
		return ind + "{{- range $r := $.resources }}\n" + l + "\n"
	case "- " + sGroup:
		return ind + "- {{ $r.group | toJson }}\n"
	case "- " + sResource:
		return ind + "- {{ $r.resource | toJson }}\n" +
			ind + "{{- if and (eq $r.group \"apps\") (has $r.resource " + listLiteral(policy.ScalableWorkloads) + ") }}\n" +
			ind + "- {{ printf \"%s/scale\" $r.resource | toJson }}\n" +
			ind + "{{- end }}\n"
	case "scope: '*'":
		return l + "\n" + strings.TrimPrefix(ind, "  ") + "{{- end }}\n"
	}
	for _, se := range [][2]string{
		{sName, "$.name"}, {sNamespace, "$.namespace"}, {sService, "$.service"},
		{sStampFP, "$.stampFailurePolicy"}, {sFieldsFP, "$.fieldsFailurePolicy"}, {sBreak, "$.breakGlassGroup"},
	} {
		s, expr := se[0], se[1]
		if !strings.Contains(t, s) {
			continue
		}
		key, value, ok := strings.Cut(t, ": ")
		if !ok {
			fail(fmt.Errorf("sentinel %q outside a key: value line: %q", s, l))
		}
		var v string
		if err := yaml.Unmarshal([]byte(value), &v); err != nil {
			fail(fmt.Errorf("line %q: %w", l, err))
		}
		pre, post, _ := strings.Cut(v, s)
		if pre == "" && post == "" {
			return ind + key + ": {{ " + expr + " | toJson }}\n"
		}
		return ind + key + ": {{ print " + strconv.Quote(pre) + " " + expr + " " + strconv.Quote(post) + " | toJson }}\n"
	}
	if strings.Contains(t, "sg-sentinel") || strings.Contains(t, "SG-SENTINEL") {
		fail(fmt.Errorf("a sentinel left in %q", l))
	}
	return l + "\n"
}

func listLiteral(items []string) string {
	q := make([]string, len(items))
	for i, s := range items {
		q[i] = strconv.Quote(s)
	}
	return "(list " + strings.Join(q, " ") + ")"
}

func indent(l string) string { return l[:len(l)-len(strings.TrimLeft(l, " "))] }

// hunk: at base line at, removed lines are only in the base and added
// lines only in the variant.
type hunk struct {
	at, removed int
	added       []string
}

// diff aligns a and b by their longest common subsequence.
func diff(a, b []string) []hunk {
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []hunk
	i, j := 0, 0
	cur := func() *hunk {
		if len(out) == 0 || out[len(out)-1].at+out[len(out)-1].removed != i {
			out = append(out, hunk{at: i})
		}
		return &out[len(out)-1]
	}
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			i, j = i+1, j+1
			out = slices.Clip(out)
			out = append(out, hunk{at: -1}) // a break between hunks
		case j < len(b) && (i == len(a) || lcs[i][j+1] >= lcs[i+1][j]):
			h := cur()
			h.added = append(h.added, b[j])
			j++
		default:
			h := cur()
			h.removed++
			i++
		}
	}
	return slices.DeleteFunc(out, func(h hunk) bool { return h.at < 0 || (h.removed == 0 && len(h.added) == 0) })
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "chartgen:", err)
	os.Exit(1)
}
