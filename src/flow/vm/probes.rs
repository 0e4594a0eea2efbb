//! The start-up checks of the shim clusters: at a VM's first tick each cluster the configuration names
//! gets a Webdis `PING`, so that a wrong cluster name (an Istio cluster is `outbound|<port>||<host>`)
//! shows in the log at start, not as a `quota_unavailable` on the first request. One VM of the process
//! checks each cluster (the others see its mark in shared data).

use crate::flow::cx::Cx;
use crate::flow::effect::{CalloutReply, Effect, Level, Purpose};
use crate::flow::metric::Metric;
use crate::flow::shim;

/// Shared-data key marking that a cluster was checked recently (one VM of the process checks it).
fn probe_key(cluster: &str) -> String {
    format!("tg:probe:{cluster}")
}

/// At a VM's first tick: checks each shim cluster the configuration names with a Webdis `PING`, so a
/// wrong cluster name (an Istio cluster is `outbound|<port>||<host>`) shows in the log at start, not as
/// a `quota_unavailable` on the first request. One VM of the process checks each cluster (the others
/// see its mark in shared data).
pub fn start(cx: &mut Cx) {
    let mut targets: Vec<(String, String, u32)> = Vec::new();
    if let Some(q) = &cx.cfg.quota {
        targets.push((q.cluster.clone(), q.authority.clone(), q.timeout_ms));
    }
    if let Some(g) = &cx.cfg.global {
        if !targets.iter().any(|(c, ..)| *c == g.cluster) {
            targets.push((g.cluster.clone(), g.authority.clone(), g.timeout_ms));
        }
    }
    let now = cx.now();
    for (cluster, authority, timeout_ms) in targets {
        let key = probe_key(&cluster);
        let recent = matches!(cx.store().get(&key), Ok(Some((b, _))) if crate::store::read_u64(&b, 0)
            .is_some_and(|t| now.saturating_sub(t) < 60_000_000_000));
        if recent {
            continue;
        }
        let _ = cx.store().set(&key, &now.to_le_bytes(), 0);
        cx.worker.probes.inflight.push(cluster.clone());
        cx.fx.push(Effect::Dispatch(shim::callout(
            Purpose::Probe,
            &cluster,
            &authority,
            timeout_ms.max(1000),
            "PING".to_string(),
        )));
    }
}

pub fn on_reply(cx: &mut Cx, reply: CalloutReply) {
    if cx.worker.probes.inflight.is_empty() {
        return;
    }
    let cluster = cx.worker.probes.inflight.remove(0);
    let pong = reply.status == 200 && reply.body.windows(4).any(|w| w == b"PONG");
    match reply.refused {
        Some(s) => {
            cx.inc(Metric::ShimClusterUnreachable);
            cx.log(
                Level::Error,
                format!(
                    "{}: quota and global-bucket calls to it will fail (on_failure applies)",
                    shim::describe_refusal(&cluster, s)
                ),
            );
        }
        None if pong => cx.log(
            Level::Info,
            format!("webdis shim at cluster '{cluster}' answers PING"),
        ),
        None => {
            cx.inc(Metric::ShimClusterUnreachable);
            cx.log(
                Level::Warn,
                format!(
                    "webdis shim at cluster '{cluster}' did not answer PING (HTTP {}{}): quota and global-bucket calls will fail until it does (on_failure applies)",
                    reply.status,
                    if reply.status == 503 { ": no healthy host, or Webdis cannot reach Redis" } else if reply.status == 504 { ": timeout" } else { "" }
                ),
            );
        }
    }
}
