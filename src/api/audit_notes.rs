//! What resolvers note for the audit trail about the root field they serve:
//! the project it acted in (`policy::require` notes it) and the user a `login`
//! signed in. The trail puts a fresh [`Notes`] into each request and reads
//! each field's notes back once it has resolved.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_graphql::{Context, QueryPathSegment};
use uuid::Uuid;

/// What resolvers noted of each root field of this request, by response key.
#[derive(Clone, Default)]
pub(super) struct Notes(Arc<Mutex<HashMap<String, Noted>>>);

#[derive(Clone, Default)]
pub(super) struct Noted {
    pub(super) project: Option<Uuid>,
    pub(super) user: Option<Uuid>,
    /// What it did, beside its arguments (an exec's exit status, the bytes
    /// it moved), recorded with them.
    pub(super) facts: Vec<(&'static str, serde_json::Value)>,
}

impl Notes {
    /// What was noted of the root field answered under `key`.
    pub(super) fn of(&self, key: &str) -> Noted {
        self.0
            .lock()
            .ok()
            .and_then(|m| m.get(key).cloned())
            .unwrap_or_default()
    }
}

fn note(ctx: &Context<'_>, with: impl FnOnce(&mut Noted)) {
    let Some(notes) = ctx.data_opt::<Notes>() else {
        return;
    };
    let Some(mut node) = ctx.path_node.as_ref() else {
        return;
    };
    while let Some(parent) = node.parent {
        node = parent;
    }
    let key = segment(node.segment);
    if let Ok(mut map) = notes.0.lock() {
        with(map.entry(key).or_default());
    }
}

/// Records that the current root field acts in `project` (the first project
/// it names is kept).
pub(crate) fn note_project(ctx: &Context<'_>, project: Uuid) {
    note(ctx, |noted| {
        noted.project.get_or_insert(project);
    });
}

/// Records the user a `login` signed in: the caller, from now on.
pub(crate) fn note_user(ctx: &Context<'_>, user: Uuid) {
    note(ctx, |noted| noted.user = Some(user));
}

/// Records a fact about what the current root field did, kept in its audit
/// entry beside its arguments under `name`.
pub(crate) fn note_fact(ctx: &Context<'_>, name: &'static str, value: serde_json::Value) {
    note(ctx, |noted| noted.facts.push((name, value)));
}

/// A root field's response key.
pub(super) fn segment(segment: QueryPathSegment<'_>) -> String {
    match segment {
        QueryPathSegment::Name(name) => name.to_owned(),
        QueryPathSegment::Index(i) => i.to_string(),
    }
}
