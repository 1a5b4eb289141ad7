//! `raftmq.v1.Broker` over gRPC. Reads and status are answered locally;
//! everything that changes state runs on the leader, so a follower forwards
//! it there itself (the client never has to find the leader).

use std::future::Future;
use std::sync::Arc;

use raftmq_raft::NodeAddr;
use raftmq_raft::acl::Check;
use raftmq_raft::command::{TopicConfig, TopicMessageType};
use raftmq_raft::consumption::GroupConfig;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::broker::Broker;
use crate::broker::auth::{CallInfo, Caller};
use crate::broker::group_admin::ResetTarget;
use crate::broker::read::StoredMessage;
use crate::broker::status::NodeStatus;
use crate::error::BrokerError;
use crate::grpc;
use crate::grpc::admin_access::{self, Named};
use crate::proto::pb;
use crate::proto::pb::broker_client::BrokerClient;
use crate::proto::pb::broker_server;
use crate::proto::v1::{from_pb, to_pb};

pub struct BrokerService {
    broker: Arc<Broker>,
}

impl BrokerService {
    pub fn new(broker: Arc<Broker>) -> broker_server::BrokerServer<BrokerService> {
        broker_server::BrokerServer::new(BrokerService { broker })
            .max_decoding_message_size(crate::MAX_MESSAGE_SIZE)
            .max_encoding_message_size(crate::MAX_MESSAGE_SIZE)
    }

    /// Runs `local` here when this node leads, or forwards the request to
    /// the leader with `forward` ([`grpc::on_leader`]).
    async fn on_leader<Req, Resp, L, LF, F, FF>(
        &self,
        request: Request<Req>,
        local: L,
        forward: F,
    ) -> Result<Resp, Status>
    where
        Req: Clone,
        L: FnOnce(Req) -> LF,
        LF: Future<Output = Result<Resp, BrokerError>>,
        F: Fn(BrokerClient<Channel>, Request<Req>) -> FF,
        FF: Future<Output = Result<Response<Resp>, Status>>,
    {
        let forward = |channel, r| {
            let call = forward(v1_client(channel), r);
            async move { call.await.map(Response::into_inner) }
        };
        Ok(grpc::on_leader(&self.broker, request, local, forward).await?)
    }
}

impl BrokerService {
    /// Refuses `request` unless its caller may do `checks` (the topic and
    /// group rows of [`admin_access`]'s table; the gate did the rest).
    async fn allow<R>(&self, request: &Request<R>, checks: &[Check]) -> Result<(), Status> {
        if !self.broker.acl_enabled() {
            return Ok(());
        }
        let call = CallInfo::of(request);
        // The gate in front authenticated the caller and left it here.
        match request.extensions().get::<Caller>() {
            Some(caller) => {
                let ip = call.ip();
                self.broker
                    .checked(|| self.broker.authorize(caller, checks, ip))
                    .await?
            }
            None => drop(self.broker.checked(|| self.broker.access(&call, checks)).await?),
        }
        Ok(())
    }

    /// [`Self::allow`] with what the request names.
    async fn allow_named<R: Named>(&self, request: &Request<R>) -> Result<(), Status> {
        if !self.broker.acl_enabled() {
            return Ok(());
        }
        self.allow(request, &request.get_ref().checks(&self.broker.cfg.cluster))
            .await
    }
}

/// A `raftmq.v1.Broker` client over a channel to another node.
fn v1_client(channel: Channel) -> BrokerClient<Channel> {
    BrokerClient::new(channel)
        .max_decoding_message_size(crate::MAX_MESSAGE_SIZE)
        .max_encoding_message_size(crate::MAX_MESSAGE_SIZE)
}

#[tonic::async_trait]
impl broker_server::Broker for BrokerService {
    async fn send(&self, request: Request<pb::SendRequest>) -> Result<Response<pb::SendResponse>, Status> {
        self.allow_named(&request).await?;
        let _in_progress = self.broker.admit_send()?;
        let out = self
            .on_leader(
                request,
                |req| async move {
                    let messages = req.messages.into_iter().map(from_pb).collect();
                    let stored = self.broker.send_local(&req.topic, req.queue_id, messages).await?;
                    Ok(pb::SendResponse {
                        first_queue_offset: stored.first_queue_offset,
                        count: stored.count,
                        duplicates: stored
                            .duplicates
                            .iter()
                            .map(|d| pb::SentBefore {
                                index: d.index,
                                queue_id: d.queue_id,
                                queue_offset: d.queue_offset,
                            })
                            .collect(),
                    })
                },
                |mut c, r| async move { c.send(r).await },
            )
            .await?;
        Ok(Response::new(out))
    }

    async fn read(&self, request: Request<pb::ReadRequest>) -> Result<Response<pb::ReadResponse>, Status> {
        self.allow_named(&request).await?;
        let r = request.into_inner();
        let batch = self
            .broker
            .scan(false, move |b| b.read(&r.topic, r.queue_id, r.offset, r.max_count))
            .await?;
        Ok(Response::new(pb::ReadResponse {
            messages: batch.messages.into_iter().map(stored_to_pb).collect(),
            next_offset: batch.next_offset,
            max_offset: batch.max_offset,
        }))
    }

    async fn put_topic(&self, request: Request<pb::PutTopicRequest>) -> Result<Response<pb::PutTopicResponse>, Status> {
        self.allow_named(&request).await?;
        let out = self
            .on_leader(
                request,
                |req| async move {
                    self.broker
                        .put_topic_local(TopicConfig {
                            name: req.name.clone(),
                            read_queues: req.read_queues,
                            write_queues: req.write_queues,
                            perm: req.perm,
                            message_type: TopicMessageType::parse(&req.message_type).ok_or_else(|| {
                                BrokerError::Invalid(format!(
                                    "message type {}: expected NORMAL, FIFO, DELAY, TRANSACTION or MIXED",
                                    req.message_type
                                ))
                            })?,
                        })
                        .await?;
                    Ok(pb::PutTopicResponse {})
                },
                |mut c, r| async move { c.put_topic(r).await },
            )
            .await?;
        Ok(Response::new(out))
    }

    async fn get_topic(&self, request: Request<pb::GetTopicRequest>) -> Result<Response<pb::TopicData>, Status> {
        self.allow_named(&request).await?;
        let out = self
            .on_leader(
                request,
                |req| async move {
                    self.broker.node.linearizable().await?;
                    let t = self.broker.topic(&req.name)?;
                    Ok(pb::TopicData {
                        name: t.name,
                        read_queues: t.read_queues,
                        write_queues: t.write_queues,
                        perm: t.perm,
                        message_type: t.message_type.as_str().to_string(),
                    })
                },
                |mut c, r| async move { c.get_topic(r).await },
            )
            .await?;
        Ok(Response::new(out))
    }

    async fn get_consumer_group(
        &self,
        request: Request<pb::GetConsumerGroupRequest>,
    ) -> Result<Response<pb::ConsumerGroupInfo>, Status> {
        self.allow(
            &request,
            &admin_access::group_checks(request.get_ref(), admin_access::GET),
        )
        .await?;
        let out = self
            .on_leader(
                request,
                |req| async move {
                    self.broker.node.linearizable().await?;
                    let g = self
                        .broker
                        .node
                        .sm
                        .with_metadata(|m| m.groups.get(&req.name).cloned())
                        .ok_or_else(|| {
                            BrokerError::Refused(
                                crate::proto::rocketmq::v2::Code::ConsumerGroupNotFound,
                                format!("consumer group {} does not exist", req.name),
                            )
                        })?;
                    Ok(pb::ConsumerGroupInfo {
                        name: g.name,
                        fifo: g.fifo,
                        max_delivery_attempts: g.max_delivery_attempts,
                    })
                },
                |mut c, r| async move { c.get_consumer_group(r).await },
            )
            .await?;
        Ok(Response::new(out))
    }

    async fn delete_topic(
        &self,
        request: Request<pb::DeleteTopicRequest>,
    ) -> Result<Response<pb::PutTopicResponse>, Status> {
        self.allow_named(&request).await?;
        let out = self
            .on_leader(
                request,
                |req| async move {
                    self.broker.delete_topic_local(&req.name).await?;
                    Ok(pb::PutTopicResponse {})
                },
                |mut c, r| async move { c.delete_topic(r).await },
            )
            .await?;
        Ok(Response::new(out))
    }

    async fn put_consumer_group(
        &self,
        request: Request<pb::PutConsumerGroupRequest>,
    ) -> Result<Response<pb::PutConsumerGroupResponse>, Status> {
        self.allow_named(&request).await?;
        let out = self
            .on_leader(
                request,
                |req| async move {
                    self.broker
                        .put_group_local(GroupConfig {
                            name: req.name.clone(),
                            fifo: req.fifo,
                            max_delivery_attempts: req.max_delivery_attempts,
                        })
                        .await?;
                    Ok(pb::PutConsumerGroupResponse {})
                },
                |mut c, r| async move { c.put_consumer_group(r).await },
            )
            .await?;
        Ok(Response::new(out))
    }

    async fn list_consumer_groups(
        &self,
        _request: Request<pb::ListConsumerGroupsRequest>,
    ) -> Result<Response<pb::ConsumerGroupList>, Status> {
        let groups = self.broker.node.sm.with_metadata(|m| {
            m.groups
                .values()
                .map(|g| pb::ConsumerGroupInfo {
                    name: g.name.clone(),
                    fifo: g.fifo,
                    max_delivery_attempts: g.max_delivery_attempts,
                })
                .collect()
        });
        Ok(Response::new(pb::ConsumerGroupList { groups }))
    }

    async fn group_progress(
        &self,
        request: Request<pb::GroupProgressRequest>,
    ) -> Result<Response<pb::GroupProgressResponse>, Status> {
        self.allow_named(&request).await?;
        let group = request.into_inner().group;
        if group.is_empty() {
            return Ok(Response::new(progress_of(&self.broker, None)));
        }
        crate::broker::pop::validate_group(&group)?;
        Ok(Response::new(progress_of(&self.broker, Some(&group))))
    }

    async fn delete_consumer_group(
        &self,
        request: Request<pb::GetConsumerGroupRequest>,
    ) -> Result<Response<pb::PutConsumerGroupResponse>, Status> {
        self.allow(
            &request,
            &admin_access::group_checks(request.get_ref(), admin_access::DELETE),
        )
        .await?;
        let out = self
            .on_leader(
                request,
                |req| async move {
                    self.broker.delete_group_local(&req.name).await?;
                    Ok(pb::PutConsumerGroupResponse {})
                },
                |mut c, r| async move { c.delete_consumer_group(r).await },
            )
            .await?;
        Ok(Response::new(out))
    }

    async fn topic_status(
        &self,
        request: Request<pb::GetTopicRequest>,
    ) -> Result<Response<pb::TopicStatusResponse>, Status> {
        self.allow_named(&request).await?;
        let name = request.into_inner().name;
        // Reads the last message of every queue: off the async workers.
        let queues = self
            .broker
            .scan(false, move |b| b.topic_status(&name))
            .await?
            .into_iter()
            .map(|q| pb::QueueStatus {
                queue: q.queue,
                min_offset: q.min_offset,
                max_offset: q.max_offset,
                last_store_ms: q.last_store_ms,
            })
            .collect();
        Ok(Response::new(pb::TopicStatusResponse { queues }))
    }

    async fn reset_offset(
        &self,
        request: Request<pb::ResetOffsetRequest>,
    ) -> Result<Response<pb::GroupProgressResponse>, Status> {
        self.allow_named(&request).await?;
        let out = self
            .on_leader(
                request,
                |req| async move {
                    let target = if req.to_end {
                        ResetTarget::End
                    } else if !req.offsets.is_empty() {
                        ResetTarget::Offsets(req.offsets.iter().map(|o| (o.queue, o.offset)).collect())
                    } else {
                        ResetTarget::Time(req.timestamp_ms)
                    };
                    self.broker.reset_offset_local(&req.group, &req.topic, &target).await?;
                    Ok(progress_of(&self.broker, Some(&req.group)))
                },
                |mut c, r| async move { c.reset_offset(r).await },
            )
            .await?;
        Ok(Response::new(out))
    }

    async fn query_messages(
        &self,
        request: Request<pb::QueryMessagesRequest>,
    ) -> Result<Response<pb::QueryMessagesResponse>, Status> {
        self.allow_named(&request).await?;
        let r = request.into_inner();
        let max = if r.max == 0 { 32 } else { r.max.min(1024) as usize };
        let (wanted, by_id) = match r.by {
            Some(pb::query_messages_request::By::MessageId(id)) => (id, true),
            Some(pb::query_messages_request::By::Key(k)) => (k, false),
            Some(pb::query_messages_request::By::TimeRange(t)) => {
                let found = self
                    .broker
                    .scan(false, move |b| {
                        b.query_time_range(&r.topic, t.queue_id, t.begin_ms, t.end_ms, max)
                    })
                    .await?;
                let (queue_ids, messages) = found.into_iter().map(|(q, m)| (q, stored_to_pb(m))).unzip();
                return Ok(Response::new(pb::QueryMessagesResponse { messages, queue_ids }));
            }
            None => return Err(Status::invalid_argument("give a message id, a key or a time range")),
        };
        let messages = self
            .broker
            .scan(false, move |b| b.query_messages(&r.topic, &wanted, by_id, max))
            .await?;
        Ok(Response::new(pb::QueryMessagesResponse {
            messages: messages.into_iter().map(stored_to_pb).collect(),
            queue_ids: vec![],
        }))
    }

    async fn status(&self, request: Request<pb::StatusRequest>) -> Result<Response<pb::StatusResponse>, Status> {
        let with_digest = request.into_inner().with_digest;
        let status = if with_digest {
            self.broker.scan(true, |b| b.status(true)).await?
        } else {
            self.broker.status(false)?
        };
        Ok(Response::new(status_to_pb(status)))
    }

    async fn add_node(&self, request: Request<pb::AddNodeRequest>) -> Result<Response<pb::MembershipResponse>, Status> {
        let out = self
            .on_leader(
                request,
                |req| async move {
                    let addr = NodeAddr {
                        raft_addr: req.raft_addr.clone(),
                        client_addr: req.client_addr.clone(),
                    };
                    self.broker
                        .node
                        .add_node(req.node_id, addr)
                        .await
                        .map_err(BrokerError::from)?;
                    Ok(pb::MembershipResponse {})
                },
                |mut c, r| async move { c.add_node(r).await },
            )
            .await?;
        Ok(Response::new(out))
    }

    async fn remove_node(
        &self,
        request: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::MembershipResponse>, Status> {
        let node = &self.broker.node;
        // Removing the leader: leadership moves to another voter first, and
        // the request follows it there (a leader does not remove itself).
        if request.get_ref().node_id == node.id
            && node.is_leader()
            && node.hand_over(raftmq_raft::node::HAND_OVER_WAIT).await.is_none()
        {
            return Err(Status::unavailable(
                "this node leads and no other voter took leadership over within 2 s; retry",
            ));
        }
        let out = self
            .on_leader(
                request,
                |req| async move {
                    self.broker
                        .node
                        .remove_node(req.node_id)
                        .await
                        .map_err(BrokerError::from)?;
                    Ok(pb::MembershipResponse {})
                },
                |mut c, r| async move { c.remove_node(r).await },
            )
            .await?;
        Ok(Response::new(out))
    }

    async fn list_clients(&self, request: Request<pb::ListClientsRequest>) -> Result<Response<pb::ClientList>, Status> {
        use prost::Message as _;
        let r = request.into_inner();
        let now = std::time::Instant::now();
        let ago = |t: std::time::Instant| now.saturating_duration_since(t).as_millis() as u64;
        // The table is bounded (limits.max_clients, MAX_CLIENT_TOPICS each),
        // and the answer stops at MAX_CLIENT_LIST_BYTES.
        let mut bytes = 0;
        let mut truncated = false;
        let mut clients = Vec::new();
        let matching = self
            .broker
            .clients
            .all()
            .into_iter()
            .filter(|(_, c)| r.group.is_empty() || c.group.as_deref() == Some(r.group.as_str()))
            .filter(|(_, c)| r.topic.is_empty() || c.topics.contains(&r.topic))
            .map(|(id, c)| pb::ClientEntry {
                waiting_receives: self.broker.long_polls.waiting_of(&id) as u32,
                client_id: id,
                client_type: match c.client_type {
                    crate::proto::rocketmq::v2::ClientType::Unspecified => String::new(),
                    t => t.as_str_name().to_string(),
                },
                group: c.group.unwrap_or_default(),
                language: c.language,
                version: c.version,
                address: c.owner.ip.map(|ip| ip.to_string()).unwrap_or_default(),
                last_heartbeat_ms_ago: ago(c.last_seen),
                topics: c.topics,
                telemetry: c.telemetry.is_some(),
                subscriptions: c
                    .subscriptions
                    .into_iter()
                    .map(|s| pb::ClientSubscription {
                        topic: s.topic,
                        expression_type: s.expression_type,
                        expression: s.expression,
                    })
                    .collect(),
                received: c.received,
                acked: c.acked,
                last_receive_ms_ago: c.last_receive.map(ago),
            });
        for e in matching {
            bytes += e.encoded_len();
            if bytes > MAX_CLIENT_LIST_BYTES {
                truncated = true;
                break;
            }
            clients.push(e);
        }
        Ok(Response::new(pb::ClientList {
            clients,
            node_id: self.broker.node.id,
            truncated,
        }))
    }

    async fn ping(&self, request: Request<pb::PingRequest>) -> Result<Response<pb::PingResponse>, Status> {
        Ok(Response::new(pb::PingResponse {
            payload: request.into_inner().payload,
        }))
    }

    async fn check_transaction(
        &self,
        request: Request<pb::CheckTransactionRequest>,
    ) -> Result<Response<pb::CheckTransactionResponse>, Status> {
        let sent =
            crate::broker::held::transactions::check_for_peer(&self.broker, request.get_ref()).map_err(Status::from)?;
        Ok(Response::new(pb::CheckTransactionResponse { sent }))
    }

    async fn read_held(&self, request: Request<pb::ReadHeldRequest>) -> Result<Response<pb::ReadHeldResponse>, Status> {
        let r = request.into_inner();
        let id = raftmq_raft::held::HeldId {
            index: r.log_index,
            ordinal: r.ordinal,
        };
        let (m, stored_ms) = crate::broker::held::read_local(&self.broker.node, id).map_err(Status::from)?;
        Ok(Response::new(pb::ReadHeldResponse {
            message: crate::broker::held::stored_bytes(&m, stored_ms),
        }))
    }

    async fn set_writable(
        &self,
        request: Request<pb::SetWritableRequest>,
    ) -> Result<Response<pb::SetWritableResponse>, Status> {
        let out = self
            .on_leader(
                request,
                |req| async move {
                    let was_writable = self.broker.set_writable_local(req.writable).await?;
                    Ok(pb::SetWritableResponse { was_writable })
                },
                |mut c, r| async move { c.set_writable(r).await },
            )
            .await?;
        Ok(Response::new(out))
    }

    async fn set_dedup(&self, request: Request<pb::SetDedupRequest>) -> Result<Response<pb::SetDedupResponse>, Status> {
        let out = self
            .on_leader(
                request,
                |req| async move {
                    let (cfg, ids) = self.broker.set_dedup_local(req.window_ms, req.max_ids).await?;
                    Ok(pb::SetDedupResponse {
                        window_ms: cfg.window_ms,
                        max_ids: cfg.max_ids,
                        ids: ids as u64,
                    })
                },
                |mut c, r| async move { c.set_dedup(r).await },
            )
            .await?;
        Ok(Response::new(out))
    }

    async fn get_broker_config(
        &self,
        _request: Request<pb::GetBrokerConfigRequest>,
    ) -> Result<Response<pb::BrokerConfigResponse>, Status> {
        let entries = self
            .broker
            .config_entries()?
            .into_iter()
            .map(|e| pb::ConfigEntry {
                key: e.key,
                value: e.value,
                runtime: e.runtime,
            })
            .collect();
        Ok(Response::new(pb::BrokerConfigResponse {
            node_id: self.broker.node.id,
            entries,
        }))
    }

    async fn change_acl(
        &self,
        request: Request<pb::ChangeAclRequest>,
    ) -> Result<Response<pb::ChangeAclResponse>, Status> {
        let out = self
            .on_leader(
                request,
                |req| async move {
                    let cmd = crate::broker::acl_admin::parse_command(&req.command_json)?;
                    self.broker.change_acl_local(cmd).await?;
                    Ok(pb::ChangeAclResponse {})
                },
                |mut c, r| async move { c.change_acl(r).await },
            )
            .await?;
        Ok(Response::new(out))
    }

    async fn read_acl(&self, _request: Request<pb::ReadAclRequest>) -> Result<Response<pb::ReadAclResponse>, Status> {
        let (users, acls) = self.broker.read_acl();
        Ok(Response::new(pb::ReadAclResponse {
            users: users
                .into_iter()
                .map(|u| pb::AclUser {
                    name: u.name,
                    user_type: u.user_type.to_string(),
                    status: u.status.to_string(),
                })
                .collect(),
            policies: acls
                .into_iter()
                .map(|(subject, entries)| pb::AclPolicy {
                    subject,
                    entries: entries
                        .into_iter()
                        .map(|e| pb::AclEntry {
                            resource: e.resource.to_string(),
                            actions: e.actions.iter().map(|a| a.to_string()).collect(),
                            source_ips: e.source_ips,
                            decision: e.decision.to_string(),
                        })
                        .collect(),
                })
                .collect(),
        }))
    }

    async fn update_broker_config(
        &self,
        request: Request<pb::UpdateBrokerConfigRequest>,
    ) -> Result<Response<pb::UpdateBrokerConfigResponse>, Status> {
        let r = request.into_inner();
        let old_value = self.broker.update_config(&r.key, &r.value)?;
        let new_value = self
            .broker
            .config_entries()?
            .into_iter()
            .find(|e| e.key == r.key)
            .map(|e| e.value)
            .unwrap_or_default();
        Ok(Response::new(pb::UpdateBrokerConfigResponse {
            node_id: self.broker.node.id,
            old_value,
            new_value,
        }))
    }

    async fn transfer_leader(
        &self,
        request: Request<pb::TransferLeaderToRequest>,
    ) -> Result<Response<pb::MembershipResponse>, Status> {
        let out = self
            .on_leader(
                request,
                |req| async move {
                    self.broker
                        .node
                        .transfer_leader(req.node_id)
                        .await
                        .map_err(BrokerError::from)?;
                    Ok(pb::MembershipResponse {})
                },
                |mut c, r| async move { c.transfer_leader(r).await },
            )
            .await?;
        Ok(Response::new(out))
    }
}

/// A group's progress (every group's: `None`) as the wire message.
fn progress_of(broker: &Broker, group: Option<&str>) -> pb::GroupProgressResponse {
    pb::GroupProgressResponse {
        queues: crate::broker::progress::progress(&broker.node, group)
            .into_iter()
            .map(|p| pb::QueueProgress {
                lag: p.lag(),
                group: p.group,
                topic: p.topic,
                queue: p.queue,
                broker_offset: p.broker_offset,
                consumer_offset: p.consumer_offset,
                inflight: p.inflight,
            })
            .collect(),
    }
}

fn stored_to_pb(m: StoredMessage) -> pb::Message {
    to_pb(m.message, m.store_timestamp_ms, m.queue_offset)
}

/// Largest `ListClients` answer; a client's settings may name many topics.
const MAX_CLIENT_LIST_BYTES: usize = 16 << 20;

fn status_to_pb(s: NodeStatus) -> pb::StatusResponse {
    pb::StatusResponse {
        node_id: s.node_id,
        group: s.group,
        role: s.role.to_string(),
        term: s.term,
        leader_id: s.leader_id,
        last_log_index: s.last_log_index,
        commit_index: s.commit_index,
        applied_index: s.applied_index,
        members: s
            .members
            .into_iter()
            .map(|m| pb::Member {
                node_id: m.node_id,
                raft_addr: m.addr.raft_addr,
                client_addr: m.addr.client_addr,
                voter: m.voter,
            })
            .collect(),
        applied_log_digest: s.applied_log_digest,
        log_start_index: s.log_start_index,
        writable: s.writable,
        store_bytes: s.store_bytes,
        disk_used_ratio: s.disk_used_ratio,
        messages_in_total: s.messages_in_total,
        messages_out_total: s.messages_out_total,
        disk_full: s.disk_full,
    }
}
