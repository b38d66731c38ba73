//! The "watch" feature: a [`HealthBoard`] kept current from the engine.
//!
//! One task per configured engine: it connects, reads the engine's clock,
//! fills the board from every container, network and volume the provider
//! made (found by the `io.corbel.managed-by` label), then follows the
//! engine's events from that moment on, so nothing that happened during
//! the read is missed (an event already reflected by the read only says the
//! same again). When the event stream fails or ends, the task connects
//! again after a pause, reads the whole board again (a thing gone meanwhile
//! turns DOWN) and follows the events once more.
//!
//! Container events come filtered by the label (`start`, `die` with its
//! `exitCode`, `oom`, `health_status`, `destroy`). The engine's network and
//! volume events carry no labels, so their `destroy` is asked for by type and
//! matched against the networks and volumes the board knows.
//!
//! A resource being destroyed through `DestroyResource` is not watched: its
//! `die` and `destroy` say nothing, and once destroyed it is forgotten (no
//! DOWN for it). Its late events, or a read that raced the destroy, are
//! dropped for a while after (`GONE_FOR`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::{EventMessage, EventMessageTypeEnum};
use bollard::query_parameters::{
    EventsOptions, ListContainersOptions, ListNetworksOptions, ListVolumesOptions,
};
use corbel_provider_sdk::proto::{self, Health};
use corbel_provider_sdk::{HealthBoard, Status, StatusSink};
use futures_util::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::engine::{self, LABEL_MANAGED_BY, LABEL_RESOURCE, MANAGED_BY, Problem, call, status};
use crate::health::{self, Observed, REMOVED};

/// How long a destroyed resource's late events are dropped.
const GONE_FOR: Duration = Duration::from_secs(300);
/// The pause before connecting again, doubled after each failure up to the
/// longest.
const FIRST_PAUSE: Duration = Duration::from_millis(500);
const LONGEST_PAUSE: Duration = Duration::from_secs(30);
/// How long a watch waits for the first read of the engine.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// The board, and the task that keeps it current.
pub struct Watcher {
    board: HealthBoard,
    state: Mutex<State>,
    /// Whether the board holds a whole read of the engine.
    ready: watch::Sender<bool>,
    /// The task following the engine, and the `docker_host` it follows.
    task: Mutex<Option<(Option<String>, JoinHandle<()>)>>,
}

#[derive(Default)]
struct State {
    /// Resources a DestroyResource is working on.
    destroying: HashSet<String>,
    /// Resources destroyed through DestroyResource, and when.
    gone: HashMap<String, Instant>,
    /// Networks (by id) and volumes (by name) the board knows: their
    /// resource ids.
    objects: HashMap<String, String>,
    /// Containers (by resource) whose `oom` event came before their `die`.
    oom: HashSet<String>,
    /// Why the last read of the engine failed, for a watch that waits.
    last_error: Option<String>,
}

impl Default for Watcher {
    fn default() -> Self {
        Watcher {
            board: HealthBoard::new(),
            state: Mutex::new(State::default()),
            ready: watch::channel(false).0,
            task: Mutex::new(None),
        }
    }
}

impl Watcher {
    pub fn board(&self) -> &HealthBoard {
        &self.board
    }

    /// Follows the engine at `host` (bollard's defaults when `None`): starts
    /// the task, or starts it again for another host. The board of another
    /// engine is no more: what the new one holds is read anew.
    pub fn follow(self: &Arc<Self>, host: Option<String>) {
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((following, handle)) = task.as_ref()
            && *following == host
            && !handle.is_finished()
        {
            return;
        }
        if let Some((_, handle)) = task.take() {
            handle.abort();
            self.ready.send_replace(false);
            for status in self.board.all() {
                self.board.forget(&status.resource_id);
            }
        }
        let watcher = Arc::clone(self);
        let following = host.clone();
        let handle = tokio::spawn(async move { watcher.run(following).await });
        *task = Some((host, handle));
    }

    /// Stops following the engine.
    pub fn stop(&self) {
        if let Some((_, handle)) = self.task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            handle.abort();
        }
    }

    /// `WatchResources`: once the board holds a read of the engine, the
    /// board's stream.
    pub async fn serve(
        &self,
        request: proto::WatchResourcesRequest,
        sink: StatusSink,
    ) -> Result<(), Status> {
        let mut ready = self.ready.subscribe();
        let waited = tokio::time::timeout(READY_WITHIN, ready.wait_for(|ready| *ready))
            .await
            .is_ok_and(|r| r.is_ok());
        if !waited {
            let why = self.lock().last_error.clone().unwrap_or_default();
            return Err(Status::unavailable(format!(
                "the provider has not read the engine's state yet: {why}"
            )));
        }
        self.board.serve(request, sink).await
    }

    /// A DestroyResource of `resource_id` begins: its events say nothing.
    pub fn destroying(&self, resource_id: &str) {
        self.lock().destroying.insert(resource_id.to_owned());
    }

    /// The DestroyResource of `resource_id` ended: destroyed, it is
    /// forgotten; else it is watched again.
    pub fn destroyed(&self, resource_id: &str, done: bool) {
        let mut state = self.lock();
        state.destroying.remove(resource_id);
        if done {
            let now = Instant::now();
            state
                .gone
                .retain(|_, at| now.duration_since(*at) < GONE_FOR);
            state.gone.insert(resource_id.to_owned(), now);
            state.objects.retain(|_, id| id != resource_id);
            self.board.forget(resource_id);
        }
    }

    /// A deploy of `resource_id` begins: a destroyed id deployed again is
    /// watched again.
    pub fn deploying(&self, resource_id: &str) {
        self.lock().gone.remove(resource_id);
    }

    /// Reads `resource`'s thing from the engine onto the board (after a
    /// deploy, or a destroy that failed half-way).
    pub async fn refresh(&self, client: &Docker, resource: &proto::Resource) {
        let id = &resource.resource_id;
        let observed = match resource.r#type.as_str() {
            crate::CONTAINER | crate::job::JOB => {
                match crate::container::find(client, resource).await {
                    Ok(Some(found)) => health::of_container(&found),
                    Ok(None) => Observed::new(Health::Down, REMOVED),
                    Err(_) => return,
                }
            }
            crate::NETWORK => match engine::networks_of(client, id).await {
                Ok(found) => self.object(found.into_iter().next().map(|(net, _)| net), id),
                Err(_) => return,
            },
            crate::VOLUME => match engine::volumes_of(client, id).await {
                Ok(found) => self.object(found.into_iter().next().map(|(name, _)| name), id),
                Err(_) => return,
            },
            _ => return,
        };
        if !self.skips(id) {
            self.board.put(observed.status(id));
        }
    }

    /// A network or volume found (by its engine key) or not.
    fn object(&self, key: Option<String>, resource_id: &str) -> Observed {
        match key {
            Some(key) => {
                self.lock().objects.insert(key, resource_id.to_owned());
                Observed::healthy()
            }
            None => Observed::new(Health::Down, REMOVED),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `resource_id`'s news is dropped: being or lately destroyed.
    fn skips(&self, resource_id: &str) -> bool {
        let state = self.lock();
        state.destroying.contains(resource_id)
            || state
                .gone
                .get(resource_id)
                .is_some_and(|at| at.elapsed() < GONE_FOR)
    }

    /// The task: connect, read, follow; again after a pause on failure.
    async fn run(self: Arc<Self>, host: Option<String>) {
        let mut pause = FIRST_PAUSE;
        loop {
            let problem = match self.session(host.as_deref(), &mut pause).await {
                Ok(()) => "the engine's event stream ended".to_owned(),
                Err(problem) => problem.message,
            };
            tracing::warn!(error = %problem, "docker: watching the engine; connecting again");
            self.lock().last_error = Some(problem);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }

    /// One connection: the board read, then the events until they fail.
    async fn session(&self, host: Option<&str>, pause: &mut Duration) -> Result<(), Problem> {
        let client = engine::connect(host).await?;
        let info = call("reading the engine's clock", client.info()).await?;
        // A second early: what the read already shows only comes again.
        let since = info
            .system_time
            .as_deref()
            .and_then(health::unix_ms)
            .unwrap_or_else(corbel_provider_sdk::now_ms)
            / 1000
            - 1;
        self.fill(&client).await?;
        tracing::debug!(
            since,
            "docker: the board is read; following the engine's events"
        );
        self.ready.send_replace(true);
        *pause = FIRST_PAUSE;
        let options = |filters: &[(&str, &[&str])]| EventsOptions {
            since: Some(since.to_string()),
            until: None,
            filters: Some(
                filters
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect()))
                    .collect(),
            ),
        };
        let label = format!("{LABEL_MANAGED_BY}={MANAGED_BY}");
        let containers = client.events(Some(options(&[
            ("type", &["container"]),
            ("label", &[label.as_str()]),
            (
                "event",
                &["start", "die", "oom", "health_status", "destroy"],
            ),
        ])));
        let objects = client.events(Some(options(&[
            ("type", &["network", "volume"]),
            ("event", &["destroy"]),
        ])));
        let mut events = futures_util::stream::select(Box::pin(containers), Box::pin(objects));
        while let Some(event) = events.next().await {
            let event = event.map_err(|e| Problem::engine("following the engine's events", &e))?;
            self.apply(&client, event).await;
        }
        Ok(())
    }

    /// Reads every thing the provider made onto the board; one the board
    /// held that is no longer there turns DOWN. What a deploy or an event
    /// wrote on the board while the read went on is newer than the read, and
    /// stays.
    async fn fill(&self, client: &Docker) -> Result<(), Problem> {
        let label = format!("{LABEL_MANAGED_BY}={MANAGED_BY}");
        let filters = Some(HashMap::from([("label".to_owned(), vec![label])]));
        let before = Before(
            self.board
                .all()
                .into_iter()
                .map(|s| (s.resource_id.clone(), s))
                .collect(),
        );
        let mut seen = HashSet::new();
        let options = ListContainersOptions {
            all: true,
            filters: filters.clone(),
            ..Default::default()
        };
        let mut containers =
            call("listing containers", client.list_containers(Some(options))).await?;
        containers.sort_by_key(|c| c.created.unwrap_or_default());
        for listed in containers {
            let (Some(id), Some(resource)) = (listed.id, resource_of(listed.labels.as_ref()))
            else {
                continue;
            };
            let found = match client.inspect_container(&id, None).await {
                Ok(found) => found,
                Err(e) if status(&e) == Some(404) => continue,
                Err(e) => return Err(Problem::engine("inspecting a container", &e)),
            };
            seen.insert(resource.clone());
            if !self.skips(&resource) && before.holds(&self.board, &resource) {
                self.board
                    .put(health::of_container(&found).status(&resource));
            }
        }
        let options = ListNetworksOptions {
            filters: filters.clone(),
        };
        for net in call("listing networks", client.list_networks(Some(options))).await? {
            if let (Some(key), Some(resource)) = (net.id, resource_of(net.labels.as_ref())) {
                self.found_object(key, resource, &mut seen, &before);
            }
        }
        let options = ListVolumesOptions { filters };
        let volumes = call("listing volumes", client.list_volumes(Some(options))).await?;
        for volume in volumes.volumes.unwrap_or_default() {
            if let Some(resource) = resource_of(Some(&volume.labels)) {
                self.found_object(volume.name, resource, &mut seen, &before);
            }
        }
        for id in before.0.keys() {
            if !seen.contains(id) && !self.skips(id) && before.holds(&self.board, id) {
                self.board
                    .put(Observed::new(Health::Down, REMOVED).status(id));
            }
        }
        Ok(())
    }

    fn found_object(
        &self,
        key: String,
        resource: String,
        seen: &mut HashSet<String>,
        before: &Before,
    ) {
        seen.insert(resource.clone());
        if !self.skips(&resource) && before.holds(&self.board, &resource) {
            self.lock().objects.insert(key, resource.clone());
            self.board.put(Observed::healthy().status(&resource));
        }
    }

    /// One event onto the board.
    async fn apply(&self, client: &Docker, event: EventMessage) {
        let actor = event.actor.unwrap_or_default();
        let attributes = actor.attributes.unwrap_or_default();
        let container = event.typ == Some(EventMessageTypeEnum::CONTAINER);
        let resource = if container {
            attributes.get(LABEL_RESOURCE).cloned()
        } else {
            let key = actor.id.clone().unwrap_or_default();
            self.lock().objects.get(&key).cloned()
        };
        let action = event.action.unwrap_or_default();
        tracing::debug!(?resource, %action, skips = resource.as_deref().is_some_and(|r| self.skips(r)), "docker: an engine event");
        let Some(resource) = resource.filter(|r| !self.skips(r)) else {
            return;
        };
        let at = event.time_nano.map(|n| n / 1_000_000);
        let observed = match action.as_str() {
            "start" => {
                self.lock().oom.remove(&resource);
                Observed::healthy()
            }
            "die" => {
                let code: i64 = attributes
                    .get("exitCode")
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(-1);
                let job = crate::job::is_job(Some(&attributes));
                match self.lock().oom.remove(&resource) {
                    // A job's end: its deploy tells how it went.
                    false if job && code == 0 => Observed::new(Health::Healthy, health::COMPLETED),
                    true => Observed::exited(code, health::OOM),
                    false if code < 0 => Observed::new(Health::Down, "exited"),
                    false => Observed::exited(code, health::exit_reason(code)),
                }
            }
            "oom" => {
                self.lock().oom.insert(resource.clone());
                Observed::new(Health::Degraded, health::OOM)
            }
            "health_status: healthy" => Observed::healthy(),
            "health_status: unhealthy" => {
                let id = actor.id.unwrap_or_default();
                let reason = match client.inspect_container(&id, None).await {
                    Ok(found) => match health::of_container(&found) {
                        o if o.health == Health::Degraded => o.reason,
                        _ => health::failing_check(None, None),
                    },
                    Err(_) => health::failing_check(None, None),
                };
                Observed::new(Health::Degraded, reason)
            }
            // Only what the board holds: a deploy's false start is no news.
            "destroy" if self.board.get(&resource).is_some() => {
                Observed::new(Health::Down, REMOVED)
            }
            _ => return,
        };
        self.board.put(
            Observed {
                since_ms: at,
                ..observed
            }
            .status(&resource),
        );
    }
}

/// The board as a read of the engine began.
struct Before(HashMap<String, proto::ResourceStatus>);

impl Before {
    /// Whether the board holds for `resource_id` what it held then: nothing
    /// newer than the read was written meanwhile.
    fn holds(&self, board: &HealthBoard, resource_id: &str) -> bool {
        board.get(resource_id).as_ref() == self.0.get(resource_id)
    }
}

/// The resource id a thing's labels name.
fn resource_of(labels: Option<&HashMap<String, String>>) -> Option<String> {
    labels?
        .get(LABEL_RESOURCE)
        .filter(|id| !id.is_empty())
        .cloned()
}
