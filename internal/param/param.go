// Package param is the error of an invalid constructor argument or
// configuration field that says which one it is, so that a caller that
// read the settings from a file (package policy) can point at the field
// that set it, keeping the error itself as the cause.
//
//	return nil, param.Errorf("burst", "%w: token bucket: burst %d, want ≥ 1", ErrInvalidParams, burst)
//
//	var pe *param.Error
//	if errors.As(err, &pe) { field := fieldOf[pe.Param] }
package param

import "fmt"

// Error is an invalid parameter. Its message and what it wraps are the
// underlying error's.
type Error struct {
	// Param names the parameter as the Go API does: an argument ("burst")
	// or a configuration field ("ShedExit").
	Param string
	err   error
}

// Errorf returns an Error about param with the message of
// fmt.Errorf(format, args...), which it wraps.
func Errorf(param, format string, args ...any) error {
	return &Error{Param: param, err: fmt.Errorf(format, args...)}
}

func (e *Error) Error() string { return e.err.Error() }

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.err }
