package coap

import (
	"strconv"
	"strings"
)

// A CoAP Content-Format is a number (RFC 7252 §12.3, the IANA registry
// "CoAP Content-Formats"); a gateway.Message carries a MIME type. The
// front end maps the registered numbers below to their names and back.
// Any other number n is named "application/vnd.coap-cf.<n>", which maps
// back to n, so a Content-Format survives the trip up and down whatever
// it is. A content type with no number is sent down without a
// Content-Format.
var contentFormats = map[uint16]string{
	0:     "text/plain;charset=utf-8",
	40:    "application/link-format",
	41:    "application/xml",
	42:    "application/octet-stream",
	47:    "application/exi",
	50:    "application/json",
	51:    "application/json-patch+json",
	52:    "application/merge-patch+json",
	60:    "application/cbor",
	61:    "application/cwt",
	62:    "application/multipart-core",
	63:    "application/cbor-seq",
	110:   "application/senml+json",
	111:   "application/sensml+json",
	112:   "application/senml+cbor",
	113:   "application/sensml+cbor",
	11542: "application/vnd.oma.lwm2m+tlv",
	11543: "application/vnd.oma.lwm2m+json",
	11544: "application/vnd.oma.lwm2m+cbor",
}

// unregisteredFormat prefixes the name of a Content-Format number with no
// entry in contentFormats.
const unregisteredFormat = "application/vnd.coap-cf."

// contentFormatNumbers maps contentFormats back: name → number.
var contentFormatNumbers = func() map[string]uint16 {
	m := make(map[string]uint16, len(contentFormats))
	for n, name := range contentFormats {
		m[name] = n
	}
	return m
}()

// contentType names Content-Format number cf.
func contentType(cf uint16) string {
	if name, ok := contentFormats[cf]; ok {
		return name
	}
	return unregisteredFormat + strconv.FormatUint(uint64(cf), 10)
}

// contentFormat is the Content-Format number of MIME type t: its entry
// in contentFormats (compared without spaces and case, so that
// "text/plain; charset=UTF-8" is 0), or the number of an
// "application/vnd.coap-cf.<n>"; ok is false for any other type and for
// "".
func contentFormat(t string) (cf uint16, ok bool) {
	if t == "" {
		return 0, false
	}
	norm := strings.ToLower(strings.ReplaceAll(t, " ", ""))
	if n, ok := contentFormatNumbers[norm]; ok {
		return n, true
	}
	if digits, found := strings.CutPrefix(norm, unregisteredFormat); found {
		n, err := strconv.ParseUint(digits, 10, 16)
		if err == nil && strconv.FormatUint(n, 10) == digits {
			return uint16(n), true
		}
	}
	return 0, false
}
