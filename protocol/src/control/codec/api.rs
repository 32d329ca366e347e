//! Each controller API as one type behind `ControllerApi`: its request and
//! response types and the four codec functions between them and the wire.
//! A generic round trip over every API (tests/control_round_trip.rs) and one
//! fuzz target over every decoder (`decode_with_every_api`) use it, so a new
//! API is covered by adding its impl here.

use super::*;

/// One API of the controller: request and response bodies.
pub trait ControllerApi {
    const NAME: &'static str;
    type Request;
    /// What the controller encodes.
    type Response;
    /// What a client decodes (the response as the wire carries it).
    type Decoded;

    fn encode_request(request: &Self::Request) -> Vec<u8>;
    fn decode_request(body: &[u8]) -> Result<Self::Request, WireError>;
    fn encode_response(response: &Self::Response) -> Vec<u8>;
    fn decode_response(body: &[u8]) -> Result<Self::Decoded, WireError>;
    /// What decoding the encoding of `response` gives.
    fn as_decoded(response: &Self::Response) -> Self::Decoded;
}

macro_rules! symmetric_api {
    ($api:ident, $name:literal, $request:ty, $response:ty,
     $encode_request:ident, $decode_request:ident, $encode_response:ident, $decode_response:ident) => {
        #[derive(Debug)]
        pub struct $api;

        impl ControllerApi for $api {
            const NAME: &'static str = $name;
            type Request = $request;
            type Response = $response;
            type Decoded = $response;

            fn encode_request(request: &$request) -> Vec<u8> {
                $encode_request(request)
            }
            fn decode_request(body: &[u8]) -> Result<$request, WireError> {
                $decode_request(body)
            }
            fn encode_response(response: &$response) -> Vec<u8> {
                $encode_response(response)
            }
            fn decode_response(body: &[u8]) -> Result<$response, WireError> {
                $decode_response(body)
            }
            fn as_decoded(response: &$response) -> $response {
                response.clone()
            }
        }
    };
}

symmetric_api!(
    RegisterBrokerApi,
    "RegisterBroker",
    RegisterBroker,
    Result<Registered, ApiFailure>,
    encode_register_broker_request,
    decode_register_broker_request,
    encode_register_broker_response,
    decode_register_broker_response
);

symmetric_api!(
    BrokerHeartbeatApi,
    "BrokerHeartbeat",
    BrokerHeartbeat,
    Result<SessionState, ApiFailure>,
    encode_broker_heartbeat_request,
    decode_broker_heartbeat_request,
    encode_broker_heartbeat_response,
    decode_broker_heartbeat_response
);

symmetric_api!(
    AlterIsrApi,
    "AlterIsr",
    AlterIsr,
    Result<(PartitionIndex, PartitionRecord), ApiFailure>,
    encode_alter_isr_request,
    decode_alter_isr_request,
    encode_alter_isr_response,
    decode_alter_isr_response
);

symmetric_api!(
    CreateTopicsApi,
    "CreateTopics",
    Vec<CreateTopicSpec>,
    Vec<TopicOutcome>,
    encode_create_topics_request,
    decode_create_topics_request,
    encode_create_topics_response,
    decode_create_topics_response
);

symmetric_api!(
    DeleteTopicsApi,
    "DeleteTopics",
    Vec<String>,
    Vec<TopicOutcome>,
    encode_delete_topics_request,
    decode_delete_topics_request,
    encode_delete_topics_response,
    decode_delete_topics_response
);

symmetric_api!(
    AlterTopicConfigsApi,
    "AlterTopicConfigs",
    Vec<AlterTopicConfigSpec>,
    Vec<TopicOutcome>,
    encode_alter_topic_configs_request,
    decode_alter_topic_configs_request,
    encode_alter_topic_configs_response,
    decode_alter_topic_configs_response
);

symmetric_api!(
    AllocateProducerIdsApi,
    "AllocateProducerIds",
    AllocateProducerIds,
    Result<ProducerIdBlock, ApiFailure>,
    encode_allocate_producer_ids_request,
    decode_allocate_producer_ids_request,
    encode_allocate_producer_ids_response,
    decode_allocate_producer_ids_response
);

#[derive(Debug)]
pub struct DescribeClusterApi;

impl ControllerApi for DescribeClusterApi {
    const NAME: &'static str = "DescribeCluster";
    type Request = ();
    type Response = ClusterDescription;
    type Decoded = Result<ClusterDescription, ApiFailure>;

    fn encode_request(_: &()) -> Vec<u8> {
        encode_describe_cluster_request()
    }
    fn decode_request(body: &[u8]) -> Result<(), WireError> {
        decode_describe_cluster_request(body)
    }
    fn encode_response(response: &ClusterDescription) -> Vec<u8> {
        encode_describe_cluster_response(response)
    }
    fn decode_response(body: &[u8]) -> Result<Self::Decoded, WireError> {
        decode_describe_cluster_response(body)
    }
    fn as_decoded(response: &ClusterDescription) -> Self::Decoded {
        Ok(response.clone())
    }
}

#[derive(Debug)]
pub struct FetchMetadataApi;

impl ControllerApi for FetchMetadataApi {
    const NAME: &'static str = "FetchMetadata";
    type Request = FetchMetadata;
    type Response = Result<MetadataAnswer, ApiFailure>;
    type Decoded = Result<MetadataUpdate, ApiFailure>;

    fn encode_request(request: &FetchMetadata) -> Vec<u8> {
        encode_fetch_metadata_request(request)
    }
    fn decode_request(body: &[u8]) -> Result<FetchMetadata, WireError> {
        decode_fetch_metadata_request(body)
    }
    fn encode_response(response: &Self::Response) -> Vec<u8> {
        encode_fetch_metadata_response(response)
    }
    fn decode_response(body: &[u8]) -> Result<Self::Decoded, WireError> {
        decode_fetch_metadata_response(body)
    }
    fn as_decoded(response: &Self::Response) -> Self::Decoded {
        response.clone().map(metadata_update)
    }
}

/// The update a broker decodes from `answer`: broker records lose what only
/// the controller keeps (sessions, incarnations).
pub fn metadata_update(answer: MetadataAnswer) -> MetadataUpdate {
    match answer {
        MetadataAnswer::Image(image) => MetadataUpdate::Image(ImageView {
            metadata_version: image.metadata_version,
            brokers: image.brokers.iter().map(broker_view).collect(),
            topics: image.topics,
        }),
        MetadataAnswer::Deltas {
            metadata_version,
            deltas,
        } => MetadataUpdate::Deltas {
            metadata_version,
            deltas: deltas
                .into_iter()
                .map(|d| (d.version, delta_view(d.delta)))
                .collect(),
        },
    }
}

fn delta_view(delta: Delta) -> DeltaView {
    match delta {
        Delta::BrokerRegistered(record) => DeltaView::BrokerRegistered(broker_view(&record)),
        Delta::BrokerFenced(id) => DeltaView::BrokerFenced(id),
        Delta::BrokerUnfenced(id) => DeltaView::BrokerUnfenced(id),
        Delta::TopicCreated(topic) => DeltaView::TopicCreated(topic),
        Delta::TopicDeleted { topic_id, name } => DeltaView::TopicDeleted { topic_id, name },
        Delta::PartitionChanged {
            topic_id,
            partition,
            record,
        } => DeltaView::PartitionChanged {
            topic_id,
            partition,
            record,
        },
        Delta::TopicConfigChanged { topic_id, config } => {
            DeltaView::TopicConfigChanged { topic_id, config }
        }
    }
}

/// Runs every decoder of every API over `body`, for the fuzz target and the
/// garbage test: none may panic, whatever the bytes.
pub fn decode_with_every_api(body: &[u8]) {
    fn both<A: ControllerApi>(body: &[u8]) {
        let _ = A::decode_request(body);
        let _ = A::decode_response(body);
    }
    both::<RegisterBrokerApi>(body);
    both::<BrokerHeartbeatApi>(body);
    both::<FetchMetadataApi>(body);
    both::<AlterIsrApi>(body);
    both::<DescribeClusterApi>(body);
    both::<CreateTopicsApi>(body);
    both::<DeleteTopicsApi>(body);
    both::<AlterTopicConfigsApi>(body);
    both::<AllocateProducerIdsApi>(body);
}
