//! The SQL92 filter against RocketMQ's behaviour: what parses, what is
//! refused and why, and what matches.

use std::cmp::Ordering;

use super::value::*;
use super::*;

type Props = &'static [(&'static str, &'static str)];

fn lookup(props: Props) -> impl Fn(&str) -> Option<&'static str> {
    move |name| props.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
}

fn eval_str(expr: &str, props: Props, tag: Option<&'static str>) -> Result<Option<bool>, String> {
    SqlFilter::parse(expr)
        .unwrap_or_else(|e| panic!("{expr:?} does not parse: {e}"))
        .evaluate(lookup(props), tag)
}

#[test]
fn matches_table() {
    const NONE: Props = &[];
    #[rustfmt::skip]
    let cases: &[(&str, Props, Option<&'static str>, bool)] = &[
        // numeric comparisons against numeric strings
        ("a > 5", &[("a", "10")], None, true),
        ("a > 5", &[("a", "5")], None, false),
        ("a >= 5", &[("a", "5")], None, true),
        ("a < 5", &[("a", "-3")], None, true),
        ("a <= 5", &[("a", "6")], None, false),
        ("a = 10", &[("a", "10")], None, true),
        ("a = 10", &[("a", "+10")], None, true),
        ("a <> 10", &[("a", "10")], None, false),
        ("a <> 10", &[("a", "11")], None, true),
        ("10 < a", &[("a", "11")], None, true),
        ("a > -5", &[("a", "-4")], None, true),
        ("a > - -5", &[("a", "4")], None, false),
        ("a > +5", &[("a", "6")], None, true),
        // 2147483648 is a long, so a 64-bit value compares
        ("a > 2147483648", &[("a", "3000000000")], None, true),
        ("a > 5L", &[("a", "6")], None, true),
        // decimals
        ("a > 3.14", &[("a", "3.1415")], None, true),
        ("a > 3.1E10", &[("a", "31415000000")], None, true),
        ("a = 1.5", &[("a", "1.50")], None, true),
        ("a > 5.0", &[("a", "5.5")], None, true),
        ("a < .5", &[("a", "0.25")], None, true),
        ("a >= 0.0", &[("a", "0")], None, true),
        ("a > 1e3", &[("a", " 1001 ")], None, true),
        ("a > 1", &[("a", "2")], None, true),
        ("5 = 5.0", NONE, None, true),
        ("a = 0.0", &[("a", "-0.0")], None, false),
        ("a > 1.0", &[("a", "NaN")], None, true),
        ("a > 1.0", &[("a", "1.5f")], None, true),
        // two properties: = compares strings, > compares doubles
        ("a > b", &[("a", "20"), ("b", "10")], None, true),
        ("a > b", &[("a", "10"), ("b", "20")], None, false),
        ("a > b", &[("a", "10"), ("b", "9.5")], None, true),
        ("a = b", &[("a", "3.14"), ("b", "3.14")], None, true),
        ("a = b", &[("a", "1"), ("b", "1.0")], None, false),
        ("a <> b", &[("a", "3.14"), ("b", "3.141")], None, true),
        // strings
        ("b = 'abc'", &[("b", "abc")], None, true),
        ("b = 'abc'", &[("b", "ABC")], None, false),
        ("b <> 'abc'", &[("b", "abd")], None, true),
        ("b = 'it''s'", &[("b", "it's")], None, true),
        ("b = ''", &[("b", "")], None, true),
        ("b = '10'", &[("b", "10.0")], None, false),
        ("b IN ('x', 'y')", &[("b", "y")], None, true),
        ("b IN ('x', 'y')", &[("b", "z")], None, false),
        ("b NOT IN ('x', 'y')", &[("b", "z")], None, true),
        ("b NOT IN ('x', 'y')", &[("b", "x")], None, false),
        ("b IN ('3', '4')", &[("b", "3.0")], None, false),
        // the tag is TAGS
        ("TAGS = 'TagA'", NONE, Some("TagA"), true),
        ("TAGS IN ('TagA', 'TagB')", NONE, Some("TagB"), true),
        ("TAGS IN ('TagA', 'TagB')", NONE, Some("TagC"), false),
        ("TAGS IN ('TagA', 'TagB')", NONE, None, false),
        ("TAGS NOT IN ('TagA')", NONE, None, false),
        ("TAGS IS NULL", NONE, None, true),
        ("TAGS IS NOT NULL AND TAGS = '''''tag'''''", NONE, Some("''tag''"), true),
        ("TAGS = 'TagA'", &[("TAGS", "TagA")], None, false),
        ("tags = 'TagA'", &[("tags", "TagA")], Some("TagB"), true),
        ("TAGS = 'TagA' AND a > 1", &[("a", "2")], Some("TagA"), true),
        // BETWEEN includes both bounds
        ("a BETWEEN 2 AND 10", &[("a", "2")], None, true),
        ("a BETWEEN 2 AND 10", &[("a", "10")], None, true),
        ("a BETWEEN 2 AND 10", &[("a", "1")], None, false),
        ("a BETWEEN 2 AND 10", &[("a", "11")], None, false),
        ("a BETWEEN 2 AND 2", &[("a", "2")], None, true),
        ("a BETWEEN 1.5 AND 2.0", &[("a", "1.75")], None, true),
        ("a BETWEEN -10 AND -20", &[("a", "-15")], None, false),
        ("a NOT BETWEEN 2 AND 10", &[("a", "1")], None, true),
        ("a NOT BETWEEN 2 AND 10", &[("a", "11")], None, true),
        ("a NOT BETWEEN 2 AND 10", &[("a", "2")], None, false),
        ("a NOT BETWEEN 2 AND 10", &[("a", "10")], None, false),
        ("a BETWEEN lo AND hi", &[("a", "5"), ("lo", "1"), ("hi", "9")], None, true),
        ("a BETWEEN 1 AND 3 AND b = 'x'", &[("a", "2"), ("b", "x")], None, true),
        // missing properties: unknown, never a match
        ("a = 'x'", NONE, None, false),
        ("a <> 'x'", NONE, None, false),
        ("NOT (a = 'x')", NONE, None, false),
        ("a > 5", NONE, None, false),
        ("NOT (a > 5)", NONE, None, false),
        ("a BETWEEN 1 AND 2", NONE, None, false),
        ("a NOT BETWEEN 1 AND 2", NONE, None, false),
        ("a NOT IN ('x')", NONE, None, false),
        ("a IS NULL", NONE, None, true),
        ("a IS NOT NULL", NONE, None, false),
        ("a IS NULL", &[("a", "")], None, false),
        ("a IS NOT NULL AND a > 5", &[("a", "6")], None, true),
        ("a IS NULL OR a = 'hello'", NONE, None, true),
        ("a IS NULL OR a = 'hello'", &[("a", "hello")], None, true),
        ("a IS NULL OR a = 'hello'", &[("a", "abc")], None, false),
        ("a = 'x' OR b = 'y'", &[("b", "y")], None, true),
        ("a = 'x' AND b = 'y'", &[("b", "y")], None, false),
        ("NOT (a = 'x' AND b = 'y')", &[("b", "z")], None, true),
        ("NOT (a = 'x' OR b = 'y')", &[("b", "z")], None, false),
        // RocketMQ's asymmetric equality
        ("'x' = a", NONE, None, false),
        ("'x' <> a", NONE, None, true),
        ("a = b", NONE, None, true),
        ("a = b", &[("a", "1")], None, false),
        // booleans
        ("TRUE", NONE, None, true),
        ("FALSE", NONE, None, false),
        ("NULL", NONE, None, false),
        ("NOT FALSE", NONE, None, true),
        ("NOT NULL", NONE, None, false),
        ("TRUE OR NULL", NONE, None, true),
        ("TRUE AND NULL", NONE, None, false),
        ("true = TRUE", NONE, None, true),
        ("c = TRUE", &[("c", "true")], None, true),
        ("c = TRUE", &[("c", "TRUE")], None, true),
        ("c = FALSE", &[("c", "yes")], None, true),
        ("a = TRUE OR b = FALSE", &[("a", "true"), ("b", "false")], None, true),
        ("a = TRUE OR b = FALSE", &[("a", "false"), ("b", "true")], None, false),
        ("1 = TRUE", NONE, None, false),
        ("c", &[("c", "true")], None, false),
        ("NOT c", &[("c", "true")], None, true),
        ("NOT c", NONE, None, false),
        ("(a = 1) = TRUE", &[("a", "1")], None, true),
        // precedence: AND before OR; NOT binds tightest
        ("a = 1 OR b = 1 AND c = 1", &[("a", "1")], None, true),
        ("(a = 1 OR b = 1) AND c = 1", &[("a", "1")], None, false),
        ("a = 1 OR b = 1 AND c = 1", &[("b", "1"), ("c", "1")], None, true),
        ("a = 1 AND b = 1 OR c = 1", &[("c", "1")], None, true),
        ("NOT a = 'x'", &[("a", "y")], None, false),
        ("NOT (a = 'x')", &[("a", "y")], None, true),
        ("NOT a IS NULL", NONE, None, true),
        ("NOT (a IS NULL)", NONE, None, false),
        ("NOT NOT (a = 'x')", &[("a", "x")], None, true),
        ("a = 1 AND NOT (b = 2)", &[("a", "1"), ("b", "3")], None, true),
        ("((a = 1))", &[("a", "1")], None, true),
        ("a > 1 = TRUE", &[("a", "2")], None, true),
        ("a IS NULL = TRUE", NONE, None, true),
        ("a = 3 and b <> 4 And c > 5 AND d <= 4", &[("a", "3"), ("b", "5"), ("c", "6"), ("d", "1")], None, true),
        ("a=3 or b<>4 Or c>5 OR d<=4", &[("a", "4"), ("b", "4"), ("c", "3"), ("d", "2")], None, true),
        ("a=3 or b<>4 Or c>5 OR d<=4", &[("a", "4"), ("b", "4"), ("c", "3"), ("d", "10")], None, false),
        // comments, case, odd names
        ("a = 1 -- trailing comment", &[("a", "1")], None, true),
        ("/* lead */ a = 1", &[("a", "1")], None, true),
        ("A = 1", &[("a", "1")], None, false),
        ("a_b$1 = 'x' and $c = 'y' and _d = 'z'", &[("a_b$1", "x"), ("$c", "y"), ("_d", "z")], None, true),
        ("\"x-trace.id\" = 'abc'", &[("x-trace.id", "abc")], None, true),
        ("type = 'x' AND date = 'y' AND select = 'z' AND value = 'v'",
            &[("type", "x"), ("date", "y"), ("select", "z"), ("value", "v")], None, true),
        ("interval = 1 OR timestamp = 2 OR user = 3 OR key = 4", &[("key", "4")], None, true),
    ];
    for (expr, props, tag, want) in cases {
        let filter = SqlFilter::parse(expr).unwrap_or_else(|e| panic!("{expr:?} does not parse: {e}"));
        assert_eq!(
            filter.matches(lookup(props), *tag),
            *want,
            "{expr:?} with {props:?}, tag {tag:?}: {:?}",
            filter.evaluate(lookup(props), *tag)
        );
    }
}

#[test]
fn three_valued_results_and_errors() {
    let ok = |b| Ok(Some(b));
    // unknown versus false
    assert_eq!(eval_str("a = 'x'", &[], None), Ok(None));
    assert_eq!(eval_str("'x' = a", &[], None), ok(false));
    assert_eq!(eval_str("a", &[], None), Ok(None));
    assert_eq!(eval_str("a", &[("a", "true")], None), ok(false));
    assert_eq!(eval_str("a = 'x' AND FALSE", &[], None), ok(false));
    assert_eq!(eval_str("a = 'x' OR TRUE", &[], None), ok(true));
    assert_eq!(eval_str("a = 'x' OR FALSE", &[], None), Ok(None));
    assert_eq!(eval_str("NOT (a > 1)", &[], None), Ok(None));
    // conversions that fail are errors, not FALSE
    assert!(eval_str("a > 5", &[("a", "abc")], None).is_err());
    assert!(eval_str("a > 5", &[("a", "5.5")], None).is_err(), "5 is an int");
    assert!(eval_str("a > 5", &[("a", "3000000000")], None).is_err(), "5 is an int");
    assert!(eval_str("a = 1", &[("a", "x")], None).is_err());
    assert!(eval_str("a = 1", &[("a", " 1")], None).is_err());
    assert!(eval_str("a > b", &[("a", "1"), ("b", "x")], None).is_err());
    assert!(eval_str("a > 1.0", &[("a", "0x10")], None).is_err());
    assert!(eval_str("a > 1.0", &[("a", "inf")], None).is_err());
    assert!(eval_str("TRUE = a", &[("a", "true")], None).is_err());
    assert!(eval_str("a BETWEEN 0 AND 100", &[("a", "abc")], None).is_err());
    assert!(
        eval_str("a BETWEEN 1.5 AND 2", &[("a", "1.75")], None).is_err(),
        "2 is an int"
    );
    // an error anywhere evaluated is no match, even under OR or NOT
    for expr in ["a > 5 OR b = 'y'", "NOT (a > 5)", "b = 'y' AND a > 5"] {
        let filter = SqlFilter::parse(expr).unwrap();
        assert!(!filter.matches(lookup(&[("a", "abc"), ("b", "y")]), None), "{expr}");
    }
    // but an operand that decides AND/OR first stops the evaluation
    assert_eq!(
        eval_str("b = 'y' OR a > 5", &[("a", "abc"), ("b", "y")], None),
        ok(true)
    );
    assert_eq!(
        eval_str("b = 'n' AND a > 5", &[("a", "abc"), ("b", "y")], None),
        ok(false)
    );
    assert_eq!(eval_str("a IS NULL OR a > 5", &[], None), ok(true));
}

#[test]
fn rejects_malformed_and_unsupported() {
    let five_kib = format!("a = '{}'", "x".repeat(5 * 1024));
    let deep = format!("{}a = 1{}", "(".repeat(1000), ")".repeat(1000));
    let not_chain = format!("{}a", "NOT ".repeat(200));
    let minus_chain = format!("a = {}1", "- ".repeat(500));
    #[rustfmt::skip]
    let cases: &[(&str, &str)] = &[
        ("", "empty"),
        ("   \n\t", "empty"),
        ("-- only a comment\n", "expected an expression"),
        ("a = 1 b", "unexpected"),
        ("a = 1)", "unbalanced"),
        ("(a = 1", "missing ')'"),
        ("((a = 1)", "missing ')'"),
        ("(a = 1 b", "expected ')'"),
        ("a = ", "expected an expression"),
        ("= 1", "expected an expression"),
        ("a = 1 AND", "expected an expression"),
        ("a AND BETWEEN 2 AND 10", "expected an expression"),
        ("a LIKE 'x%'", "unsupported operator LIKE"),
        ("a NOT LIKE 'x%'", "unsupported operator NOT LIKE"),
        ("a CONTAINS 'x'", "unsupported operator CONTAINS"),
        ("a NOT STARTSWITH 'x'", "unsupported operator NOT STARTSWITH"),
        ("a = 1 AND b ENDSWITH 'x'", "unsupported operator ENDSWITH"),
        ("upper(a) = 'X'", "function"),
        ("a = now()", "function"),
        ("a + 1 > 2", "unsupported operator +"),
        ("a * 2 > 2", "unsupported operator *"),
        ("a || 'x' = 'y'", "unsupported operator ||"),
        ("a != 1", "unsupported operator !="),
        ("a == 1", "unsupported operator =="),
        ("a = NULL", "IS NULL"),
        ("NULL <> a", "IS NULL"),
        ("a > 'abc'", "only numbers"),
        ("a > TRUE", "only numbers"),
        ("a > NULL", "only numbers"),
        ("(a = 1) > 2", "condition cannot be compared"),
        ("TRUE = 'x'", "cannot be compared"),
        ("TRUE = 1", "cannot be compared"),
        ("a BETWEEN 10 AND 0", "out of order"),
        ("a BETWEEN NULL AND 5", "NULL"),
        ("a BETWEEN 'a' AND 'b'", "only numbers"),
        ("a IN (1, 2)", "string literals"),
        ("a IN ('x', 2)", "string literals"),
        ("a IN ()", "string literals"),
        ("a IN (SELECT b FROM t)", "string literals"),
        ("'x' IN ('x')", "property on its left"),
        ("a IS TRUE", "only IS NULL"),
        ("a IS DISTINCT FROM b", "only IS NULL"),
        ("a NOT NULL", "unexpected"),
        ("a IS", "only IS NULL"),
        ("a IS NOT TRUE", "only IS NULL"),
        ("a = 1 COLLATE x", "COLLATE"),
        ("a = ANY (SELECT 1)", "quantified"),
        ("5", "boolean"),
        ("'x'", "boolean"),
        ("-a", "boolean"),
        ("NOT 5", "boolean"),
        ("a = 1 AND 5", "boolean"),
        ("a.b = 1", "quote such a name"),
        ("a[1] = 1", "unsupported operator ["),
        ("a = 1 OR", "expected an expression"),
        ("a = 99999999999999999999", "out of range"),
        ("a > 1e400", "greater than"),
        ("a = 007", "leading zeros"),
        ("a > 1.5L", "L suffix"),
        ("a = 'unterminated", "syntax error"),
        ("\"\" = 'x'", "empty property name"),
        ("a = x'AB'", "expected an expression"),
        ("a = ?", "expected an expression"),
        ("a # 1", "unexpected"),
        ("CASE WHEN a = 1 THEN TRUE END", "unexpected"),
        ("a = 1; DROP TABLE t", "unexpected"),
        ("ä = 1", "expected an expression"),
        (&five_kib, "too long"),
        (&deep, "nested too deeply"),
        (&not_chain, "nested too deeply"),
        (&minus_chain, "nested too deeply"),
    ];
    for (expr, want) in cases {
        match SqlFilter::parse(expr) {
            Ok(f) => panic!("{expr:?} parsed: {f:?}"),
            Err(e) => assert!(e.contains(want), "{expr:?}: {e:?} does not mention {want:?}"),
        }
    }
}

/// MAX_DEPTH levels of nesting parse, one more does not.
#[test]
fn nesting_limits() {
    let n = MAX_DEPTH;
    let ok = [
        format!("{}a = 1{}", "(".repeat(n), ")".repeat(n)),
        format!("{}a", "NOT ".repeat(n)),
        format!("{}(a = 1)", "NOT ".repeat(n - 1)),
        format!("a = {}1", "- ".repeat(n - 1)),
        format!("{}1 = a", "- ".repeat(n - 1)),
    ];
    for expr in &ok {
        SqlFilter::parse(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
    }
    let too_deep = [
        format!("{}a = 1{}", "(".repeat(n + 1), ")".repeat(n + 1)),
        format!("{}a", "NOT ".repeat(n + 1)),
        format!("a = {}1", "- ".repeat(n + 1)),
        // operators nested in operators, without parentheses counted
        format!("{}TRUE", "TRUE = ".repeat(n + 1)),
        format!("a{}", " IS NULL".repeat(n + 1)),
    ];
    for expr in &too_deep {
        let e = SqlFilter::parse(expr).unwrap_err();
        assert!(e.contains("nested too deeply"), "{expr}: {e}");
    }
    // A long AND / OR chain is one level.
    let chain = (0..300).map(|i| format!("a='{i}'")).collect::<Vec<_>>().join(" OR ");
    let filter = SqlFilter::parse(&chain).unwrap();
    assert!(filter.matches(lookup(&[("a", "299")]), None));
    assert!(!filter.matches(lookup(&[("a", "300")]), None));
    let chain = (0..300).map(|i| format!("a<>'{i}'")).collect::<Vec<_>>().join(" AND ");
    assert!(SqlFilter::parse(&chain).unwrap().matches(lookup(&[("a", "300")]), None));
}

/// The deepest expressions parse (or fail) and evaluate well inside a
/// quarter of the 2 MiB stack of a Tokio worker or test thread, even
/// unoptimized.
#[test]
fn deepest_expressions_fit_a_small_stack() {
    let n = MAX_DEPTH;
    let worst = [
        format!("{}a = 1{}", "(".repeat(n), ")".repeat(n)),
        format!("{}a", "NOT ".repeat(n)),
        format!("a = {}1", "- ".repeat(n)),
        // every level passes through OR, AND, = and > before its parenthesis
        format!("{}a{}", "a OR b AND c = d > (".repeat(n - 1), ")".repeat(n - 1)),
        format!("{}a = 1{}", "(".repeat(n + 1), ")".repeat(n + 1)),
    ];
    std::thread::Builder::new()
        .stack_size(512 << 10)
        .spawn(move || {
            for expr in &worst {
                if let Ok(filter) = SqlFilter::parse(expr) {
                    let _ = filter.matches(|_| Some("1"), None);
                }
            }
        })
        .unwrap()
        .join()
        .unwrap();
}

/// Random bytes and random token soups never make parse (or evaluation
/// of what parses) panic.
#[test]
fn parse_never_panics() {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    #[rustfmt::skip]
    const VOCABULARY: &[&str] = &[
        "a", "b", "TAGS", "\"q.x\"", "1", "-", "+", "2147483648", "3.5", ".5", "1e3", "5L", "'x'", "''", "TRUE",
        "FALSE", "NULL", "NOT", "AND", "OR", "IS", "IN", "BETWEEN", "(", ")", ",", "=", "<>", "<", "<=", ">",
        ">=", "!=", "LIKE", "CONTAINS", "SELECT", "*", "/", ".", "[", "]", "::", "'", "\"", "--", "/*", "*/",
        "\n", "ä", "\u{0}", "ANY", "ALL", "CASE", "f(", "0x1", "$", "#", "?", "@", ";", "IS NOT NULL",
    ];
    let props: Props = &[("a", "1"), ("b", "x"), ("q.x", "2.5")];
    let mut parsed = 0;
    for round in 0..20_000 {
        let len = (next() % 40) as usize;
        let text = if round % 2 == 0 {
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            (0..len)
                .map(|_| VOCABULARY[(next() % VOCABULARY.len() as u64) as usize])
                .collect::<Vec<_>>()
                .join(" ")
        };
        if let Ok(filter) = SqlFilter::parse(&text) {
            parsed += 1;
            let _ = filter.matches(lookup(props), Some("t"));
            let _ = filter.matches(lookup(&[]), None);
        }
    }
    assert!(parsed > 100, "only {parsed} random expressions parsed");
}

#[test]
fn api() {
    fn shareable<T: Send + Sync + 'static>() {}
    shareable::<SqlFilter>();
    let text = "region = 'eu' AND price > 9.5";
    let filter = SqlFilter::parse(text).unwrap();
    assert_eq!(filter.expression(), text);
    assert_eq!(filter.to_string(), text);
    assert_eq!(filter.clone(), SqlFilter::parse(text).unwrap());
    assert_ne!(filter, SqlFilter::parse("region = 'eu'").unwrap());
    // properties from a map
    let props: std::collections::HashMap<String, String> = [
        ("region".to_owned(), "eu".to_owned()),
        ("price".to_owned(), "10".to_owned()),
    ]
    .into();
    assert!(filter.matches(|name| props.get(name).map(String::as_str), None));
    // or from a message's property list
    let list = [("region".to_owned(), "us".to_owned())];
    assert!(!filter.matches(|n| list.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str()), None));
}

#[test]
fn java_conversions() {
    assert_eq!(parse_double(" 1.5 "), Ok(1.5));
    assert_eq!(parse_double("1.5d"), Ok(1.5));
    assert_eq!(parse_double("-Infinity"), Ok(f64::NEG_INFINITY));
    assert!(parse_double("NaN").unwrap().is_nan());
    assert_eq!(parse_double("5."), Ok(5.0));
    assert_eq!(parse_double(".5e1"), Ok(5.0));
    for bad in [
        "", "-", "f", "inf", "nan", "NaNd", "1_000", "--1", "1e", "0x1p3", "1.5 x",
    ] {
        assert!(parse_double(bad).is_err(), "{bad:?}");
    }
    assert_eq!(parse_int("+7"), Ok(7));
    assert!(parse_int("2147483648").is_err());
    assert_eq!(parse_long("2147483648"), Ok(2147483648));
    assert_eq!(java_double_cmp(-0.0, 0.0), Ordering::Less);
    assert_eq!(java_double_cmp(f64::NAN, f64::INFINITY), Ordering::Greater);
    assert_eq!(java_double_cmp(f64::NAN, f64::NAN), Ordering::Equal);
}
