package policy

import (
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/stampguard/stampguard/policy/api/annotation"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

// The field owner rule (spec.fieldOwners[i]): only the named writers may
// change the field; with onCreate, only they may set it on a create.

// RuleFieldOwner is the field owner rule's kind and audit annotation key.
const RuleFieldOwner RuleKind = annotation.FieldOwner

var ownerKind = ruleKind{kind: RuleFieldOwner, field: "fieldOwners", list: true, compile: compileOwners}

type ownerRule struct {
	index    int
	path     FieldPath
	writers  writers
	onCreate bool
	action   v1alpha1.Action
}

type writers struct {
	users    []string // usernames, service accounts expanded
	groups   []string
	managers []string
	display  string
}

var _ rule = (*ownerRule)(nil)

func compileOwners(spec *v1alpha1.ConcurrencyPolicySpec, inherited v1alpha1.Action, path *field.Path, errs *field.ErrorList) []rule {
	var out []rule
	for i, fo := range spec.FieldOwners {
		out = append(out, compileOwner(i, fo, inherited, path.Child("fieldOwners").Index(i), errs))
	}
	return out
}

func compileOwner(i int, fo v1alpha1.FieldOwner, inherited v1alpha1.Action, fp *field.Path, errs *field.ErrorList) *ownerRule {
	path, err := ParseFieldPath(fo.Path)
	if err != nil {
		*errs = append(*errs, field.Invalid(fp.Child("path"), fo.Path, err.Error()))
	}
	w, werrs := compileWriters(fo.Writers, fp.Child("writers"))
	*errs = append(*errs, werrs...)
	return &ownerRule{
		index: i, path: path, writers: w, onCreate: fo.OnCreate,
		action: checkAction(fo.Action, inherited, fp.Child("action"), errs),
	}
}

func compileWriters(w v1alpha1.Writers, path *field.Path) (writers, field.ErrorList) {
	var errs field.ErrorList
	var out writers
	var shown []string
	for i, sa := range w.ServiceAccounts {
		ns, name, ok := strings.Cut(sa, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			errs = append(errs, field.Invalid(path.Child("serviceAccounts").Index(i), sa, "want namespace/name"))
			continue
		}
		u := "system:serviceaccount:" + ns + ":" + name
		out.users = append(out.users, u)
		shown = append(shown, u)
	}
	for _, u := range w.Users {
		out.users = append(out.users, u)
		shown = append(shown, u)
	}
	for _, g := range w.Groups {
		out.groups = append(out.groups, g)
		shown = append(shown, "group "+g)
	}
	for _, m := range w.FieldManagers {
		out.managers = append(out.managers, m)
		shown = append(shown, "field manager "+m)
	}
	if len(shown) == 0 {
		errs = append(errs, field.Required(path, "a field owner needs at least one writer; use immutableFields for a field nobody may change"))
	}
	slices.Sort(out.users)
	slices.Sort(out.groups)
	slices.Sort(out.managers)
	out.display = strings.Join(shown, ", ")
	return out, errs
}

// allows reports whether the writer may change a field these writers own.
// Identity decides; field managers, asserted by the client, only narrow it.
func (w writers) allows(u UserInfo, fieldManager string) bool {
	hasIdentity := len(w.users) > 0 || len(w.groups) > 0
	if hasIdentity && !u.in(w.users, w.groups) {
		return false
	}
	if len(w.managers) > 0 {
		_, ok := slices.BinarySearch(w.managers, fieldManager)
		return ok
	}
	return true
}

func (*ownerRule) phase() phase         { return phaseFields }
func (r *ownerRule) paths() []FieldPath { return []FieldPath{r.path} }
func (r *ownerRule) ref() RuleRef {
	return RuleRef{Rule: RuleFieldOwner, Index: r.index, Action: r.action}
}

// operations are what the rule checks: updates, and creates with onCreate.
func (r *ownerRule) operations() []Operation {
	if r.onCreate {
		return updatesAndCreates
	}
	return updates
}

// onScale: a Scale carries spec.replicas.
func (r *ownerRule) onScale() bool { return r.path.pathIs("spec", "replicas") }

func (r *ownerRule) check(ev *evaluation, policy string) (Violation, bool, error) {
	old, cur, err := ev.values(r.path)
	if err != nil {
		return Violation{}, false, err
	}
	if sameValues(old, cur) || r.writers.allows(ev.req.User, ev.manager()) {
		return Violation{}, false, nil
	}
	return Violation{
		Policy: policy, Rule: RuleFieldOwner, Index: r.index, Action: r.action,
		Path: r.path.text, Writer: ev.req.User.Name,
		Message: "ConcurrencyPolicy " + strconv.Quote(policy) + ": " + r.path.text + " is owned by " + r.writers.display + "; " +
			ev.req.User.Name + " may not change it (" + showValues(old) + " -> " + showValues(cur) + ")",
	}, true, nil
}

// condition: the field changed and the writer is not an owner.
func (r *ownerRule) condition() string {
	v, ok := compilePath(r.path)
	if !ok {
		return "true"
	}
	changed := and("request.operation == 'UPDATE'", v.old+" != "+v.cur)
	if r.onCreate {
		changed = or([]string{changed, and("request.operation == 'CREATE'", v.curSet)})
	}
	return and(changed, "!("+writersCondition(r.writers)+")")
}

// writersCondition is true exactly when writers.allows would be.
func writersCondition(w writers) string {
	var terms []string
	var id []string
	if len(w.users) > 0 {
		id = append(id, reqUser+" in "+celList(w.users))
	}
	if len(w.groups) > 0 {
		id = append(id, reqGroups+".exists(g, g in "+celList(w.groups)+")")
	}
	if len(id) > 0 {
		terms = append(terms, or(id))
	}
	if len(w.managers) > 0 {
		terms = append(terms, "request.?options.?fieldManager.orValue('') in "+celList(w.managers))
	}
	return and(terms...)
}
