//! `apache.rocketmq.v2.MessagingService`: the protocol of the official
//! RocketMQ 5 clients, served by every node.
//!
//! Reads of replicated state (routes, offset-based pulls, offsets, client
//! settings) are answered by the node itself. Everything that changes state
//! (sends, pop receives, acks, invisibility changes, dead-letter moves,
//! offset commits) runs on the leader: a follower forwards the request
//! there itself, so a client connected to any node never has to find the
//! leader. Outcomes travel as v2 statuses inside the responses; the gRPC
//! status is OK unless the request could not be understood at all.
//!
//! With `[acl]` on, every call is authenticated (its `authorization`
//! signature, or a member's certificate) and authorized against what it
//! needs ([`access`]) before anything else; a refusal is the v2
//! `UNAUTHORIZED` status. A Telemetry stream is authenticated when it
//! opens.
//!
//! One file per client role; this file binds each RPC to it:
//! `producer`, `consumer` (pop), `offsets` (pull and offsets),
//! [`route`], `session` (heartbeat, Telemetry); `service` holds what
//! they share and [`settings`] what a Telemetry stream answers.

mod access;
mod consumer;
mod offsets;
mod producer;
pub mod route;
mod service;
mod session;
pub mod settings;

pub use service::MessagingService;
use service::{BoxStream, stream_of};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::proto::rocketmq::v2;
use crate::proto::rocketmq::v2::messaging_service_server::MessagingService as Service;

#[tonic::async_trait]
impl Service for MessagingService {
    type ReceiveMessageStream = BoxStream<v2::ReceiveMessageResponse>;
    type PullMessageStream = BoxStream<v2::PullMessageResponse>;
    type TelemetryStream = ReceiverStream<Result<v2::TelemetryCommand, Status>>;

    async fn query_route(&self, r: Request<v2::QueryRouteRequest>) -> Result<Response<v2::QueryRouteResponse>, Status> {
        self.answer("QueryRoute", r, |r| route::query_route(self, r)).await
    }

    async fn heartbeat(&self, r: Request<v2::HeartbeatRequest>) -> Result<Response<v2::HeartbeatResponse>, Status> {
        self.answer("Heartbeat", r, |r| session::heartbeat(self, r)).await
    }

    async fn send_message(
        &self,
        r: Request<v2::SendMessageRequest>,
    ) -> Result<Response<v2::SendMessageResponse>, Status> {
        self.answer("SendMessage", r, |r| producer::send_message(self, r)).await
    }

    async fn query_assignment(
        &self,
        r: Request<v2::QueryAssignmentRequest>,
    ) -> Result<Response<v2::QueryAssignmentResponse>, Status> {
        self.answer("QueryAssignment", r, |r| route::query_assignment(self, r))
            .await
    }

    async fn receive_message(
        &self,
        r: Request<v2::ReceiveMessageRequest>,
    ) -> Result<Response<Self::ReceiveMessageStream>, Status> {
        self.answer("ReceiveMessage", r, |r| async move {
            Ok(Response::new(consumer::receive_message(self, r).await))
        })
        .await
        .map(|r| r.map(stream_of))
    }

    async fn ack_message(&self, r: Request<v2::AckMessageRequest>) -> Result<Response<v2::AckMessageResponse>, Status> {
        self.answer("AckMessage", r, |r| consumer::ack_message(self, r)).await
    }

    async fn forward_message_to_dead_letter_queue(
        &self,
        r: Request<v2::ForwardMessageToDeadLetterQueueRequest>,
    ) -> Result<Response<v2::ForwardMessageToDeadLetterQueueResponse>, Status> {
        self.answer("ForwardMessageToDeadLetterQueue", r, |r| {
            consumer::forward_message_to_dead_letter_queue(self, r)
        })
        .await
    }

    async fn pull_message(
        &self,
        r: Request<v2::PullMessageRequest>,
    ) -> Result<Response<Self::PullMessageStream>, Status> {
        self.answer("PullMessage", r, |r| async move {
            Ok(Response::new(offsets::pull_message(self, r).await))
        })
        .await
        .map(|r| r.map(stream_of))
    }

    async fn update_offset(
        &self,
        r: Request<v2::UpdateOffsetRequest>,
    ) -> Result<Response<v2::UpdateOffsetResponse>, Status> {
        self.answer("UpdateOffset", r, |r| offsets::update_offset(self, r))
            .await
    }

    async fn get_offset(&self, r: Request<v2::GetOffsetRequest>) -> Result<Response<v2::GetOffsetResponse>, Status> {
        self.answer("GetOffset", r, |r| offsets::get_offset(self, r)).await
    }

    async fn query_offset(
        &self,
        r: Request<v2::QueryOffsetRequest>,
    ) -> Result<Response<v2::QueryOffsetResponse>, Status> {
        self.answer("QueryOffset", r, |r| offsets::query_offset(self, r)).await
    }

    async fn end_transaction(
        &self,
        r: Request<v2::EndTransactionRequest>,
    ) -> Result<Response<v2::EndTransactionResponse>, Status> {
        self.answer("EndTransaction", r, |r| producer::end_transaction(self, r))
            .await
    }

    async fn telemetry(
        &self,
        r: Request<Streaming<v2::TelemetryCommand>>,
    ) -> Result<Response<Self::TelemetryStream>, Status> {
        session::telemetry(self, r).await
    }

    async fn notify_client_termination(
        &self,
        r: Request<v2::NotifyClientTerminationRequest>,
    ) -> Result<Response<v2::NotifyClientTerminationResponse>, Status> {
        self.answer("NotifyClientTermination", r, |r| {
            session::notify_client_termination(self, r)
        })
        .await
    }

    async fn change_invisible_duration(
        &self,
        r: Request<v2::ChangeInvisibleDurationRequest>,
    ) -> Result<Response<v2::ChangeInvisibleDurationResponse>, Status> {
        self.answer("ChangeInvisibleDuration", r, |r| {
            consumer::change_invisible_duration(self, r)
        })
        .await
    }

    async fn recall_message(
        &self,
        r: Request<v2::RecallMessageRequest>,
    ) -> Result<Response<v2::RecallMessageResponse>, Status> {
        self.answer("RecallMessage", r, |r| producer::recall_message(self, r))
            .await
    }

    async fn sync_lite_subscription(
        &self,
        r: Request<v2::SyncLiteSubscriptionRequest>,
    ) -> Result<Response<v2::SyncLiteSubscriptionResponse>, Status> {
        self.answer("SyncLiteSubscription", r, |r| session::sync_lite_subscription(self, r))
            .await
    }
}
