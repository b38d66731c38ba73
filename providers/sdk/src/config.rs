//! Small pieces for reading configurations by hand, so that every error can
//! name its key: a resource's `config_json` as an object, a key's value with
//! `null` as absent, and a scalar as text.

use serde_json::{Map, Value};

/// `Resource.config_json` as an object (empty text or `null`: `{}`).
pub fn object(config_json: &str) -> Result<Map<String, Value>, String> {
    let value: Value = if config_json.trim().is_empty() {
        Value::Object(Map::new())
    } else {
        serde_json::from_str(config_json).map_err(|e| format!("config: not JSON: {e}"))?
    };
    match value {
        Value::Object(map) => Ok(map),
        Value::Null => Ok(Map::new()),
        _ => Err("config: expected a JSON object".to_string()),
    }
}

/// A key's value, treating `null` as absent.
pub fn present<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.get(key).filter(|v| !v.is_null())
}

/// A string as is; a number or a boolean as its text (a blueprint template
/// that is one whole output, such as a pid, arrives typed). Anything else has
/// no text.
pub fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn objects_absent_keys_and_scalars() {
        assert_eq!(object("").unwrap(), Map::new());
        assert_eq!(object("null").unwrap(), Map::new());
        assert_eq!(object("[1]").unwrap_err(), "config: expected a JSON object");
        assert!(object("{").unwrap_err().starts_with("config: not JSON"));
        let map = object(r#"{"a": null, "b": 1}"#).unwrap();
        assert_eq!(present(&map, "a"), None);
        assert_eq!(present(&map, "b"), Some(&json!(1)));
        assert_eq!(scalar_text(&json!(12)).as_deref(), Some("12"));
        assert_eq!(scalar_text(&json!(true)).as_deref(), Some("true"));
        assert_eq!(scalar_text(&json!([1])), None);
    }
}
