// Package cli holds what both stampguard commands (webhook, auditsink)
// do the same way on their command lines: parsing with operands between
// flags, refusing stray operands, and one exit-code convention.
//
// Exit codes:
//
//	0  done, or help was asked for (-h, --help, help)
//	2  usage: the command line cannot be carried out as given (an unknown
//	   flag, a stray argument, a bad value, a file named on the command line
//	   that is missing or malformed, contradicting flags). Nothing was done:
//	   every command validates all of it before its first side effect.
//	1  runtime: the command started and failed (ClickHouse, the apiserver,
//	   the network, a shutdown that timed out).
//
// Flags and environment: an explicit flag beats the environment, and the
// environment beats files and defaults. Each binary's options library
// (analytics/config for auditsink, cmd/webhook/app for webhook) resolves
// its options by that rule, in one place each.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// The exit codes of both commands; see the package comment.
const (
	ExitOK      = 0
	ExitRuntime = 1
	ExitUsage   = 2
)

// UsageError is an error of the command line: exit code 2.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usage marks err as a usage error (nil stays nil).
func Usage(err error) error {
	if err == nil {
		return nil
	}
	var u *UsageError
	if errors.As(err, &u) {
		return err
	}
	return &UsageError{Err: err}
}

// Usagef is Usage(fmt.Errorf(format, args...)).
func Usagef(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}

// ExitCode is the exit code for what a command returned: 0 for nil and
// flag.ErrHelp, 2 for a usage error, 1 for anything else.
func ExitCode(err error) int {
	var u *UsageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return ExitOK
	case errors.As(err, &u):
		return ExitUsage
	}
	return ExitRuntime
}

// Parse parses args into fs, which must use flag.ContinueOnError, and
// returns the operands. Flags may follow operands (`ingest a.log
// --database x`); "--" ends the flags. maxOperands bounds how many
// operands the command takes (-1: any number): one more is a usage error
// naming it, so that a word the command does not take (`webhook serve
// --policy-file p.yaml`) is refused rather than silently ending the
// flags. -h and --help print fs's usage on help and return flag.ErrHelp.
// Every other error is a UsageError that nobody printed yet: the caller
// prints it once.
func Parse(fs *flag.FlagSet, args []string, maxOperands int, help io.Writer) ([]string, error) {
	var operands []string
	fs.SetOutput(io.Discard) // the flag package's message is the error returned
	defer fs.SetOutput(help)
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(help)
				fs.Usage()
				return nil, err
			}
			return nil, &UsageError{Err: err}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		// fs.Parse stops at the first operand, and after a "--", which it
		// consumes: then everything left is an operand.
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			operands = append(operands, rest...)
			break
		}
		operands = append(operands, rest[0])
		args = rest[1:]
	}
	if maxOperands >= 0 && len(operands) > maxOperands {
		extra := operands[maxOperands]
		if maxOperands == 0 {
			return nil, Usagef("unexpected argument %q: %s takes no arguments (flags start with -)", extra, fs.Name())
		}
		return nil, Usagef("unexpected argument %q: %s takes at most %d", extra, fs.Name(), maxOperands)
	}
	return operands, nil
}

// SetUsage makes fs print "usage: LINE", a blank line, and its flags with
// their defaults, on fs's output; -h prints it, and so does a bad flag.
func SetUsage(fs *flag.FlagSet, line string) {
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "usage: %s\n", line)
		if hasFlags(fs) {
			fmt.Fprint(w, "\nflags:\n")
			fs.PrintDefaults()
		}
	}
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// IsHelp reports whether arg asks for help: -h, -help, --help or help.
func IsHelp(arg string) bool {
	switch strings.TrimLeft(arg, "-") {
	case "h", "help":
		return true
	}
	return false
}

// DurationsAsText is a slog.HandlerOptions.ReplaceAttr that logs a
// time.Duration as text ("1.5s"), where slog's JSON handler would write
// nanoseconds (1500000000).
func DurationsAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}
