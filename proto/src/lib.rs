//! The Corbel provider protocol, `corbel.provider.v1`: the generated types,
//! clients and servers, and the version handshake rule both sides apply.
//!
//! The protocol version is its own number, never the crate's: a provider built
//! against an older SDK keeps working as long as the two sides share a version.

/// Generated from `corbel/provider/v1/provider.proto`.
pub mod v1 {
    tonic::include_proto!("corbel.provider.v1");
}

/// The protocol versions this build speaks, oldest first. Version 2 is
/// version 1 plus `UpdateResource` and `ResourceDescription.updatable_keys`;
/// version 3 is version 2 plus `WatchResources` and the health fields of
/// `InspectResponse`.
pub const SUPPORTED_VERSIONS: &[u32] = &[1, 2, 3];

/// The first version with `UpdateResource` and `updatable_keys`.
pub const UPDATE_VERSION: u32 = 2;

/// The first version with `WatchResources` and `InspectResponse.health`.
pub const HEALTH_VERSION: u32 = 3;

/// The highest version both lists contain, or a message naming both lists.
pub fn negotiate(ours: &[u32], theirs: &[u32]) -> Result<u32, String> {
    ours.iter()
        .filter(|v| theirs.contains(v))
        .max()
        .copied()
        .ok_or_else(|| {
            format!(
                "no protocol version in common: this side speaks {ours:?}, the other {theirs:?}"
            )
        })
}

/// Features a provider may announce. Unknown ones are kept as given and ignored.
pub const KNOWN_FEATURES: &[&str] = &[
    "deploy",
    "destroy",
    "inspect",
    "nodes",
    "data",
    "power",
    "repository",
    "watch",
    "exec",
    "files",
];

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn the_highest_common_version_wins() {
        assert_eq!(negotiate(&[1, 2, 3], &[2, 3, 4]), Ok(3));
        assert_eq!(negotiate(&[1], &[1]), Ok(1));
        // A provider that speaks only version 1 keeps working with version 1.
        assert_eq!(negotiate(SUPPORTED_VERSIONS, &[1]), Ok(1));
        assert_eq!(negotiate(SUPPORTED_VERSIONS, &[1, 2]), Ok(UPDATE_VERSION));
        assert_eq!(
            negotiate(SUPPORTED_VERSIONS, &[1, 2, 3]),
            Ok(HEALTH_VERSION)
        );
        let refused = negotiate(&[1, 2], &[3]).unwrap_err();
        assert!(
            refused.contains("[1, 2]") && refused.contains("[3]"),
            "{refused}"
        );
    }

    #[test]
    fn messages_round_trip_and_unknown_fields_are_tolerated() {
        let request = v1::RegisterRequest {
            id: "p1".into(),
            token: "secret".into(),
            features: vec!["deploy".into(), "teleport".into()],
            protocol_version: 1,
            ..Default::default()
        };
        let bytes = request.encode_to_vec();
        assert_eq!(
            v1::RegisterRequest::decode(bytes.as_slice()).unwrap(),
            request
        );
        // A newer peer's extra field (number 99) is skipped, not an error.
        let mut newer = bytes.clone();
        newer.extend_from_slice(&[0x9a, 0x06, 0x01, b'x']);
        assert_eq!(
            v1::RegisterRequest::decode(newer.as_slice()).unwrap(),
            request
        );
    }
}
