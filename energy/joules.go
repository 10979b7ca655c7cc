package energy

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Joules is an amount of energy in joules. Profiles use it per token, where
// useful values are micro- to millijoules.
type Joules float64

// joulesUnits lists the accepted units with their power of ten. Both the
// micro sign (U+00B5) and the Greek mu (U+03BC) are accepted, because
// keyboards and editors produce either.
var joulesUnits = [...]struct {
	name string
	exp  int
}{
	{"J", 0},
	{"mJ", -3},
	{"uJ", -6},
	{"\u00b5J", -6},
	{"\u03bcJ", -6},
	{"nJ", -9},
}

const joulesUnitList = "J, mJ, uJ, µJ or nJ"

// maxJoulesLen bounds the input of ParseJoules: a per-token energy needs a
// handful of characters, and a bound keeps hostile config cheap to reject.
const maxJoulesLen = 64

// ParseJoules parses an energy such as "150uJ", "150µJ", "0.5mJ", "2J" or
// "10nJ". The unit is required, so that "150" is never silently read as
// 150 joules when 150 µJ was meant. Space between the number and the unit
// is allowed. The value must be finite and greater than zero: an unknown
// energy is written by leaving the field out.
func ParseJoules(s string) (Joules, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty energy, want a number and a unit (%s), e.g. 150uJ", joulesUnitList)
	}
	if len(t) > maxJoulesLen {
		return 0, fmt.Errorf("invalid energy %.20q...: longer than %d bytes", t, maxJoulesLen)
	}
	end := strings.LastIndexAny(t, "0123456789.") + 1
	num, unit := strings.TrimSpace(t[:end]), strings.TrimSpace(t[end:])
	if end == 0 {
		return 0, fmt.Errorf("invalid energy %q: missing number, want e.g. 150uJ", s)
	}
	if unit == "" {
		return 0, fmt.Errorf("invalid energy %q: missing unit (%s), e.g. %suJ", s, joulesUnitList, num)
	}
	exp, ok := 0, false
	for _, u := range joulesUnits {
		if u.name == unit {
			exp, ok = u.exp, true
			break
		}
	}
	if !ok {
		return 0, fmt.Errorf("invalid energy %q: unknown unit %q (want %s)", s, unit, joulesUnitList)
	}
	v, err := parseScaled(num, exp)
	if err != nil {
		return 0, fmt.Errorf("invalid energy %q: %w", s, err)
	}
	if !(v > 0) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("invalid energy %q: must be greater than zero and finite", s)
	}
	return Joules(v), nil
}

// parseScaled parses the decimal number num times 10^exp. The power of ten
// is added to num's own exponent before converting, so the result is the
// float nearest to the decimal value; dividing after converting would round
// twice and break the String/ParseJoules round trip.
func parseScaled(num string, exp int) (float64, error) {
	if num == "" {
		return 0, errors.New("missing number")
	}
	if strings.Trim(num, "0123456789.eE+-") != "" {
		return 0, fmt.Errorf("%q is not a decimal number", num)
	}
	mant := num
	if i := strings.IndexAny(num, "eE"); i >= 0 {
		mant = num[:i]
		e, err := strconv.Atoi(num[i+1:])
		if err != nil || mant == "" {
			return 0, fmt.Errorf("%q is not a decimal number", num)
		}
		if e > 1000 || e < -1000 {
			return 0, fmt.Errorf("%q is out of range", num)
		}
		exp += e
	}
	if strings.ContainsAny(mant, "eE") {
		return 0, fmt.Errorf("%q is not a decimal number", num)
	}
	v, err := strconv.ParseFloat(mant+"e"+strconv.Itoa(exp), 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return 0, fmt.Errorf("%q is out of range", num)
		}
		return 0, fmt.Errorf("%q is not a decimal number", num)
	}
	return v, nil
}

// String formats j for people, with the unit that keeps the number
// readable and at most 15 significant digits, so that computed values
// print as "60mJ" rather than "60.000000000000005mJ". Anything written
// with up to 15 digits, as configured energies are, prints exactly.
func (j Joules) String() string { return j.format("\u00b5J", 15) }

// format prints j with the given micro unit and significant digits; -1
// digits prints the shortest representation that parses back exactly.
func (j Joules) format(micro string, digits int) string {
	v := float64(j)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return strconv.FormatFloat(v, 'g', -1, 64) + "J"
	}
	switch a := math.Abs(v); {
	case a == 0:
		return "0J"
	case a >= 1:
		return shiftDecimal(v, 0, digits) + "J"
	case a >= 1e-3:
		return shiftDecimal(v, 3, digits) + "mJ"
	case a >= 1e-6:
		return shiftDecimal(v, 6, digits) + micro
	default:
		return shiftDecimal(v, 9, digits) + "nJ"
	}
}

// shiftDecimal returns v×10^shift in decimal with the given significant
// digits (-1: shortest exact), shifting the decimal digits of v rather than
// multiplying, which would add rounding noise such as "150.00000000000003".
func shiftDecimal(v float64, shift, digits int) string {
	prec := -1
	if digits > 0 {
		prec = digits - 1
	}
	s := strconv.FormatFloat(v, 'e', prec, 64) // [-]d[.ddd]e±dd
	sign := ""
	if s[0] == '-' {
		sign, s = "-", s[1:]
	}
	i := strings.IndexByte(s, 'e')
	mant, e := s[:i], s[i+1:]
	if strings.Contains(mant, ".") {
		mant = strings.TrimRight(strings.TrimRight(mant, "0"), ".")
	}
	exp, _ := strconv.Atoi(e)
	exp += shift
	if exp > 21 || exp < -21 {
		return sign + mant + "e" + strconv.Itoa(exp)
	}
	ds := strings.Replace(mant, ".", "", 1)
	switch point := exp + 1; {
	case point <= 0:
		return sign + "0." + strings.Repeat("0", -point) + ds
	case point >= len(ds):
		return sign + ds + strings.Repeat("0", point-len(ds))
	default:
		return sign + ds[:point] + "." + ds[point:]
	}
}

// MarshalJSON encodes j as a string with an ASCII unit, e.g. "150uJ",
// with every digit needed to decode exactly j.
func (j Joules) MarshalJSON() ([]byte, error) {
	if v := float64(j); math.IsNaN(v) || math.IsInf(v, 0) {
		return nil, fmt.Errorf("energy %v is not finite", v)
	}
	return []byte(`"` + j.format("uJ", -1) + `"`), nil
}

// UnmarshalJSON accepts a string with a unit, as ParseJoules does, or a bare
// JSON number of joules. A bare 0 means unknown, like an absent field; a
// string must name a positive energy.
func (j *Joules) UnmarshalJSON(b []byte) error {
	b = []byte(strings.TrimSpace(string(b)))
	if string(b) == "null" {
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := ParseJoules(s)
		if err != nil {
			return err
		}
		*j = v
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("invalid energy %s: want a string such as \"150uJ\" or a number of joules", b)
	}
	if f < 0 {
		return fmt.Errorf("invalid energy %s: must not be negative", b)
	}
	*j = Joules(f)
	return nil
}
