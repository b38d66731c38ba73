//! The calls the check makes on a provider, each answer held to the
//! protocol's rules: a deploy, update or destroy stream ends with exactly one
//! `done` or `error`, progress stays within 100%, outputs are a JSON object.
//! Every failure is a sentence for the report.

use corbel_proto::v1::{self as proto, resource_event::Event};

use super::super::link::{Link, LinkError};

pub(super) fn resource(
    key: &str,
    kind: &str,
    config: &serde_json::Value,
    id: &str,
    node: &str,
) -> proto::Resource {
    proto::Resource {
        key: key.to_owned(),
        r#type: kind.to_owned(),
        config_json: config.to_string(),
        resource_id: id.to_owned(),
        node: node.to_owned(),
        ..Default::default()
    }
}

pub(super) fn deploy_request(res: &proto::Resource) -> proto::DeployResourceRequest {
    proto::DeployResourceRequest {
        resource: Some(res.clone()),
        dependency_outputs_json: Default::default(),
    }
}

pub(super) async fn deploy(
    link: &Link,
    res: &proto::Resource,
) -> Result<serde_json::Value, String> {
    let stream = link
        .deploy_resource(deploy_request(res))
        .await
        .map_err(|e| e.to_string())?;
    follow(link, "DeployResource", stream).await
}

fn update_request(
    res: &proto::Resource,
    previous: &serde_json::Value,
    outputs: &serde_json::Value,
) -> proto::UpdateResourceRequest {
    proto::UpdateResourceRequest {
        resource: Some(res.clone()),
        previous_config_json: previous.to_string(),
        outputs_json: outputs.to_string(),
        dependency_outputs_json: Default::default(),
    }
}

pub(super) async fn update_call(
    link: &Link,
    res: &proto::Resource,
    previous: &serde_json::Value,
    outputs: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    let stream = link
        .update_resource(update_request(res, previous, outputs))
        .await
        .map_err(|e| e.to_string())?;
    follow(link, "UpdateResource", stream).await
}

/// An update of a resource that is gone: `Ok` if it succeeded, else the
/// status code it was refused with (none for an `error` event) and what was said.
pub(super) async fn update_gone(
    link: &Link,
    res: &proto::Resource,
    previous: &serde_json::Value,
    outputs: &serde_json::Value,
) -> Result<(), (Option<tonic::Code>, String)> {
    let refused = |e: LinkError| match e {
        LinkError::Refused { code, .. } => (Some(code), e.to_string()),
        other => (None, other.to_string()),
    };
    let mut stream = link
        .update_resource(update_request(res, previous, outputs))
        .await
        .map_err(refused)?;
    while let Some(message) = link
        .next("UpdateResource", &mut stream)
        .await
        .map_err(refused)?
    {
        if let Some(Event::Error(failure)) = message.event {
            return Err((None, format!("an error event: {}", failure.message)));
        }
    }
    Ok(())
}

pub(super) async fn destroy(
    link: &Link,
    res: &proto::Resource,
    outputs: &serde_json::Value,
) -> Result<String, String> {
    let stream = link
        .destroy_resource(proto::DestroyResourceRequest {
            resource: Some(res.clone()),
            outputs_json: outputs.to_string(),
        })
        .await
        .map_err(|e| e.to_string())?;
    follow(link, "DestroyResource", stream)
        .await
        .map(|_| "done".to_owned())
}

pub(super) async fn inspect(
    link: &Link,
    res: &proto::Resource,
) -> Result<Option<serde_json::Value>, String> {
    let answer = link.inspect(res.clone()).await.map_err(|e| e.to_string())?;
    if !answer.present {
        return Ok(None);
    }
    parse_outputs("Inspect", &answer.outputs_json).map(Some)
}

/// Reads a deploy or destroy stream to its end, holding it to the rules:
/// progress and log events, then exactly one `done` or `error`, then the end.
async fn follow(
    link: &Link,
    call: &'static str,
    mut stream: tonic::Streaming<proto::ResourceEvent>,
) -> Result<serde_json::Value, String> {
    let mut end: Option<Result<serde_json::Value, String>> = None;
    let mut events = 0;
    loop {
        let next = link
            .next(call, &mut stream)
            .await
            .map_err(|e| format!("{e} (after {events} event(s))"))?;
        let Some(message) = next else {
            break;
        };
        events += 1;
        let event = message.event;
        if end.is_some() {
            return Err(format!(
                "{call} sent an event after its done/error: {event:?}; a stream ends with exactly one done or error"
            ));
        }
        match event {
            Some(Event::Done(done)) => end = Some(parse_outputs(call, &done.outputs_json)),
            Some(Event::Error(failure)) => {
                end = Some(Err(format!(
                    "{call} failed{}: {}",
                    if failure.retryable {
                        " (retryable)"
                    } else {
                        ""
                    },
                    failure.message
                )));
            }
            Some(Event::Progress(p)) if p.percent > 100 => {
                return Err(format!("{call} reported {}% progress", p.percent));
            }
            Some(_) => {}
            None => return Err(format!("{call} sent an empty event")),
        }
    }
    end.unwrap_or_else(|| {
        Err(format!(
            "{call}'s stream ended after {events} event(s) without done or error"
        ))
    })
}

fn parse_outputs(call: &str, text: &str) -> Result<serde_json::Value, String> {
    let text = if text.is_empty() { "{}" } else { text };
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value @ serde_json::Value::Object(_)) => Ok(value),
        Ok(other) => Err(format!(
            "{call}'s outputs_json is not a JSON object: {other}"
        )),
        Err(e) => Err(format!("{call}'s outputs_json is not JSON: {e}")),
    }
}
