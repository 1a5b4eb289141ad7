//! Values as RocketMQ's selector evaluates them: Java's objects, Java's
//! string-to-number conversions and Java's ordering of them.

use std::cmp::Ordering;
use std::fmt;

/// A value during evaluation: RocketMQ's Java objects.
#[derive(Debug, Clone, Copy)]
pub(super) enum Value<'v> {
    Null,
    Bool(bool),
    Int(i32),
    Long(i64),
    Double(f64),
    Str(&'v str),
}

impl fmt::Display for Value<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("NULL"),
            Value::Bool(true) => f.write_str("TRUE"),
            Value::Bool(false) => f.write_str("FALSE"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Long(l) => write!(f, "{l}"),
            Value::Double(d) => write!(f, "{d:?}"),
            Value::Str(s) => write!(f, "'{}'", s.replace('\'', "''")),
        }
    }
}

/// `ComparisonExpression.__compare` with string conversion on: values of
/// different types are converted to the other side's type where Java can
/// (a failed conversion is an error), and compared as "less" where it does
/// not try.
pub(super) fn java_compare(left: Value, right: Value) -> Result<Ordering, String> {
    use Value::{Bool, Double, Int, Long, Null, Str};
    Ok(match (left, right) {
        (Bool(a), Bool(b)) => a.cmp(&b),
        (Int(a), Int(b)) => a.cmp(&b),
        (Long(a), Long(b)) => a.cmp(&b),
        (Double(a), Double(b)) => java_double_cmp(a, b),
        // Java orders UTF-16 units; only equality is ever asked of two strings.
        (Str(a), Str(b)) => a.cmp(b),
        (Int(a), Long(b)) => i64::from(a).cmp(&b),
        (Long(a), Int(b)) => a.cmp(&i64::from(b)),
        (Int(a), Double(b)) => java_double_cmp(f64::from(a), b),
        (Double(a), Int(b)) => java_double_cmp(a, f64::from(b)),
        (Long(a), Double(b)) => java_double_cmp(a as f64, b),
        (Double(a), Long(b)) => java_double_cmp(a, b as f64),
        (Int(a), Str(b)) => a.cmp(&parse_int(b)?),
        (Long(a), Str(b)) => a.cmp(&parse_long(b)?),
        (Double(a), Str(b)) => java_double_cmp(a, parse_double(b)?),
        (Str(a), Int(b)) => parse_int(a)?.cmp(&b),
        (Str(a), Long(b)) => parse_long(a)?.cmp(&b),
        (Str(a), Double(b)) => java_double_cmp(parse_double(a)?, b),
        (Str(a), Bool(b)) => a.eq_ignore_ascii_case("true").cmp(&b),
        // RocketMQ casts the boolean to a string here and fails.
        (Bool(a), Str(b)) => return Err(format!("{} cannot be compared with {}", Bool(a), Str(b))),
        // A boolean and a number: RocketMQ answers "less" without comparing.
        (Bool(_), _) | (_, Bool(_)) => Ordering::Less,
        (Null, _) | (_, Null) => return Err("NULL in a comparison".to_owned()),
    })
}

/// Java's `Double.compareTo`: numeric order, but `-0.0 < 0.0` and NaN above
/// everything and equal to itself.
pub(super) fn java_double_cmp(a: f64, b: f64) -> Ordering {
    if a < b {
        return Ordering::Less;
    }
    if a > b {
        return Ordering::Greater;
    }
    // Equal, zeros of either sign, or NaN: Java compares doubleToLongBits
    // (one NaN for all) as signed longs.
    let bits = |d: f64| {
        if d.is_nan() {
            0x7ff8_0000_0000_0000_i64
        } else {
            d.to_bits() as i64
        }
    };
    bits(a).cmp(&bits(b))
}

/// Java's `Integer.valueOf(String)`: optional sign, ASCII digits, 32 bits.
pub(super) fn parse_int(s: &str) -> Result<i32, String> {
    s.parse().map_err(|_| format!("'{s}' is not an int"))
}

/// Java's `Long.valueOf(String)`.
pub(super) fn parse_long(s: &str) -> Result<i64, String> {
    s.parse().map_err(|_| format!("'{s}' is not a long"))
}

/// Java's `Double.valueOf(String)` for decimal text: blanks (up to U+0020)
/// trimmed, optional sign, `NaN`, `Infinity`, or digits with an optional
/// point and exponent and an optional `f`/`F`/`d`/`D` suffix.
pub(super) fn parse_double(s: &str) -> Result<f64, String> {
    let err = || format!("'{s}' is not a double");
    let t = s.trim_matches(|c: char| c <= ' ');
    let (negative, body) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let magnitude = match body {
        "NaN" => f64::NAN,
        "Infinity" => f64::INFINITY,
        _ => {
            let digits = body.strip_suffix(['f', 'F', 'd', 'D']).unwrap_or(body);
            // Rust's grammar is Java's decimal one, plus "inf" and "nan".
            let decimal = digits.starts_with(|c: char| c.is_ascii_digit() || c == '.')
                && digits.bytes().all(|b| b.is_ascii_digit() || b".eE+-".contains(&b));
            if !decimal {
                return Err(err());
            }
            digits.parse().map_err(|_| err())?
        }
    };
    Ok(if negative { -magnitude } else { magnitude })
}
