//! `outboxd plugin test --expect FILE`: a report compared with a golden
//! one. Both are normalized first: durations go, and each value the
//! harness made up (listed under `generated`) is replaced, wherever it
//! appears, by its placeholder, so a report compares equal to the one that
//! `--json` printed on an earlier run.

use serde_json::Value;

/// Keys left out of a comparison: they differ on every run.
const VOLATILE_KEYS: [&str; 1] = ["duration_ms"];

/// `report` with durations removed and generated values replaced by their
/// placeholders.
pub fn normalize(report: &Value) -> Value {
    let mut generated: Vec<(String, String)> = report
        .get("generated")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(placeholder, v)| {
                    let actual = v.as_str()?;
                    (!actual.is_empty()).then(|| (placeholder.clone(), actual.to_string()))
                })
                .collect()
        })
        .unwrap_or_default();
    // A longer value first, in case one contains another.
    generated.sort_by_key(|(_, actual)| std::cmp::Reverse(actual.len()));
    let mut out = report.clone();
    walk(&mut out, &generated);
    if let Some(Value::Object(m)) = out.get_mut("generated") {
        for (placeholder, v) in m.iter_mut() {
            *v = Value::String(placeholder.clone());
        }
    }
    out
}

fn walk(v: &mut Value, generated: &[(String, String)]) {
    match v {
        Value::String(s) => {
            for (placeholder, actual) in generated {
                if s.contains(actual.as_str()) {
                    *s = s.replace(actual.as_str(), placeholder);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| walk(i, generated)),
        Value::Object(m) => {
            m.retain(|k, _| !VOLATILE_KEYS.contains(&k.as_str()));
            m.values_mut().for_each(|i| walk(i, generated));
        }
        _ => {}
    }
}

/// The differences between two normalized reports, one line each, named
/// by their path (`statements[0].values.params[2]`); empty when equal.
pub fn diff(expected: &Value, actual: &Value) -> Vec<String> {
    let mut out = Vec::new();
    diff_at("", expected, actual, &mut out);
    out
}

fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 200 {
        format!("{}…", s.chars().take(200).collect::<String>())
    } else {
        s
    }
}

fn diff_at(path: &str, expected: &Value, actual: &Value, out: &mut Vec<String>) {
    let at = |p: &str| {
        if p.is_empty() {
            "(the report)".to_string()
        } else {
            p.to_string()
        }
    };
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (k, ev) in e {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match a.get(k) {
                    Some(av) => diff_at(&p, ev, av, out),
                    None => out.push(format!("{p}: expected {}, missing", show(ev))),
                }
            }
            for (k, av) in a {
                if !e.contains_key(k) {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    out.push(format!("{p}: not expected, got {}", show(av)));
                }
            }
        }
        (Value::Array(e), Value::Array(a)) => {
            for (i, (ev, av)) in e.iter().zip(a).enumerate() {
                diff_at(&format!("{path}[{i}]"), ev, av, out);
            }
            for (i, ev) in e.iter().enumerate().skip(a.len()) {
                out.push(format!("{path}[{i}]: expected {}, missing", show(ev)));
            }
            for (i, av) in a.iter().enumerate().skip(e.len()) {
                out.push(format!("{path}[{i}]: not expected, got {}", show(av)));
            }
        }
        (e, a) if e == a => {}
        (e, a) => out.push(format!(
            "{}: expected {}, got {}",
            at(path),
            show(e),
            show(a)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::{diff, normalize};
    use serde_json::json;

    #[test]
    fn generated_values_and_durations_do_not_count() {
        let a = json!({
            "duration_ms": 3,
            "message": {"id": "m-1"},
            "statements": [{"values": {"params": ["m-1", 5]}}],
            "events": [{"id": "e-1", "headers": {"causation-id": "m-1"}}],
            "generated": {"<message-id>": "m-1", "<event-1>": "e-1"},
        });
        let b = json!({
            "duration_ms": 900,
            "message": {"id": "m-2"},
            "statements": [{"values": {"params": ["m-2", 5]}}],
            "events": [{"id": "e-2", "headers": {"causation-id": "m-2"}}],
            "generated": {"<message-id>": "m-2", "<event-1>": "e-2"},
        });
        assert_eq!(diff(&normalize(&a), &normalize(&b)), Vec::<String>::new());
        assert_eq!(
            normalize(&a)["statements"][0]["values"]["params"][0],
            "<message-id>"
        );
    }

    #[test]
    fn a_changed_value_is_named_by_its_path() {
        let e = json!({"statements": [{"values": {"params": ["x", 5]}}], "events": []});
        let a = json!({"statements": [{"values": {"params": ["x", 6]}}], "events": [{"id": 1}], "new": true});
        let d = diff(&normalize(&e), &normalize(&a));
        assert_eq!(
            d,
            vec![
                "events[0]: not expected, got {\"id\":1}".to_string(),
                "statements[0].values.params[1]: expected 5, got 6".to_string(),
                "new: not expected, got true".to_string(),
            ]
        );
    }
}
