//! How settings are written down: each area owns a `…Settings` struct whose
//! `Default` is the one place its defaults live, and whose field names are the
//! keys of its `[section]` in the config file. A leaf: durations are kept as
//! [`Duration`](std::time::Duration) in code and written in the unit the key's
//! suffix names (`_ms` or `_seconds`) by the two serde adapters here.

/// A `Duration` written as whole milliseconds (keys ending in `_ms`).
pub mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

/// A `Duration` written as whole seconds (keys ending in `_seconds`).
pub mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}

/// At least `floor`: settings whose zero would spin or never fire.
pub fn at_least<T: PartialOrd>(value: T, floor: T) -> T {
    if value < floor { floor } else { value }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Timings {
        #[serde(with = "super::millis")]
        wait_ms: Duration,
        #[serde(with = "super::seconds")]
        ttl_seconds: Duration,
    }

    #[test]
    fn durations_round_trip_in_the_unit_their_key_names() {
        let t: Timings = toml::from_str("wait_ms = 1500\nttl_seconds = 30\n").unwrap();
        assert_eq!(t.wait_ms, Duration::from_millis(1500));
        assert_eq!(t.ttl_seconds, Duration::from_secs(30));
        let back = toml::to_string(&t).unwrap();
        assert_eq!(toml::from_str::<Timings>(&back).unwrap(), t);
    }
}
