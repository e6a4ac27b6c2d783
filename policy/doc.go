// Package policy compiles ConcurrencyPolicy objects and evaluates admission
// requests against them.
//
// Evaluation is pure: the same request and policy set always give the same
// decision, because the apiserver may call the mutating phase more than once
// for one request. Objects are read as raw JSON and only the values that
// rules name are extracted, so a request that no policy matches costs almost
// nothing and one that does never decodes a whole object.
package policy
