// Package admission answers the apiserver's AdmissionReviews: it reads a
// review within bounded memory and time, decodes it, takes the decision of
// the policy set in force (PolicySource), and writes the answer, on the
// stamp check's and the field rules' paths of its TLS Server.
//
// The webhook configurations that route writes here are
// policy/webhookconfig's; where the policies come from and the process
// around the server are cmd/webhook/app's.
package admission
