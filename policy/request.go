package policy

import "slices"

// Operation is the admission operation.
type Operation string

// The admission operations stampguard acts on.
const (
	Create Operation = "CREATE"
	Update Operation = "UPDATE"
	Delete Operation = "DELETE"
)

// UserInfo is the authenticated writer of a request.
type UserInfo struct {
	Name   string
	Groups []string
}

func (u UserInfo) in(users, groups []string) bool {
	if _, ok := slices.BinarySearch(users, u.Name); ok {
		return true
	}
	for _, g := range u.Groups {
		if _, ok := slices.BinarySearch(groups, g); ok {
			return true
		}
	}
	return false
}

// Request is what evaluation needs of an AdmissionRequest. Object, OldObject
// and Options stay raw JSON; rules read only the values they name.
type Request struct {
	Operation   Operation
	Group       string // request.resource.group
	Resource    string // request.resource.resource (plural)
	SubResource string
	Namespace   string
	// Name is empty for the per-item deletes of a deletecollection: the
	// apiserver builds their admission attributes without a name.
	Name      string
	User      UserInfo
	Object    []byte
	OldObject []byte
	Options   []byte
	DryRun    bool

	// Values extracted by ScanObject while the review was decoded.
	scanned   [2]bool
	extracted [2][]valueRef
}

const (
	curObject = 0
	oldObject = 1
)
