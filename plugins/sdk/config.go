package sdk

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// DecodeConfig decodes the JSON object an adapter's Configure receives
// into v (a pointer to the adapter's config struct, holding its defaults)
// strictly: a key v has no field for, a value of the wrong type, and
// anything but white space after the object are errors. The error starts
// with "config: " and says what is wrong (an unknown key is quoted), so
// Configure can return it as it is.
func DecodeConfig(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if len(bytes.TrimLeft(raw[dec.InputOffset():], " \t\r\n")) > 0 {
		return errors.New("config: trailing data after the JSON object")
	}
	return nil
}
