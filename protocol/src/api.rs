//! API keys and the versions this build speaks. Keys are stable wire numbers:
//! a retired key is never reused.

/// Identifies the request type in a frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ApiKey {
    ApiVersions = 0,
    Metadata = 1,
    CreateTopics = 2,
    DeleteTopics = 3,
    ListTopics = 4,
    DescribeTopic = 5,
    Produce = 6,
    Fetch = 7,
    ListOffsets = 8,
}

impl ApiKey {
    pub const ALL: [ApiKey; 9] = [
        ApiKey::ApiVersions,
        ApiKey::Metadata,
        ApiKey::CreateTopics,
        ApiKey::DeleteTopics,
        ApiKey::ListTopics,
        ApiKey::DescribeTopic,
        ApiKey::Produce,
        ApiKey::Fetch,
        ApiKey::ListOffsets,
    ];

    pub fn from_u16(key: u16) -> Option<ApiKey> {
        ApiKey::ALL.into_iter().find(|k| *k as u16 == key)
    }

    /// Inclusive range of versions this build accepts.
    pub fn versions(self) -> (u16, u16) {
        (0, 0)
    }

    pub fn name(self) -> &'static str {
        match self {
            ApiKey::ApiVersions => "api_versions",
            ApiKey::Metadata => "metadata",
            ApiKey::CreateTopics => "create_topics",
            ApiKey::DeleteTopics => "delete_topics",
            ApiKey::ListTopics => "list_topics",
            ApiKey::DescribeTopic => "describe_topic",
            ApiKey::Produce => "produce",
            ApiKey::Fetch => "fetch",
            ApiKey::ListOffsets => "list_offsets",
        }
    }
}
