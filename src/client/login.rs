//! `corbel login` and `corbel logout`: a session through `login`, traded at
//! once for an API token of the CLI's own (`createApiToken`, named
//! `cli@<host>`) that goes in the credentials file; the session is ended.
//! `logout` revokes that token (`logout` with it) and removes the file.

use std::io::{BufRead as _, IsTerminal as _, Read as _};

use serde_json::{Value, json};

use super::Context;
use super::credentials::{self, Credentials};
use super::error::ClientError;

pub async fn login(
    context: &Context,
    user: Option<String>,
    password_stdin: bool,
) -> Result<(), ClientError> {
    let username = match user {
        Some(user) => user,
        None => ask_username()?,
    };
    let password = read_password(&username, &context.api.server, password_stdin)?;
    let anonymous = context.api.with_token(None);
    let session: Value = anonymous
        .get(
            "mutation($username: String!, $password: String!) { \
             login(username: $username, password: $password) { token user { username } } }",
            json!({ "username": username, "password": password }),
            "login",
        )
        .await?;
    let session_token = session["token"].as_str().unwrap_or_default().to_owned();
    let as_session = context.api.with_token(Some(session_token));
    let name = token_name();
    let made = as_session
        .get::<Value>(
            "mutation($name: String!) { createApiToken(name: $name) { token apiToken { id name } } }",
            json!({ "name": name }),
            "createApiToken",
        )
        .await;
    // The session was only the way to the token: end it either way.
    let _ = as_session.request("mutation { logout }", json!({})).await;
    let made = made?;
    let credentials = Credentials {
        server: context.api.server.clone(),
        token: made["token"].as_str().unwrap_or_default().to_owned(),
        token_id: made["apiToken"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        username: session["user"]["username"]
            .as_str()
            .unwrap_or(&username)
            .to_owned(),
    };
    // A token an earlier login stored for this server is replaced: revoke it.
    if let Some(old) = &context.stored
        && old.server == credentials.server
    {
        let old_api = context.api.with_token(Some(old.token.clone()));
        let _ = old_api.request("mutation { logout }", json!({})).await;
    }
    let path = credentials::store(&credentials)?;
    if context.output.structured() {
        context.output.value(&json!({
            "server": credentials.server,
            "username": credentials.username,
            "tokenName": name,
            "tokenId": credentials.token_id,
            "credentials": path,
        }));
    } else {
        println!(
            "Signed in to {} as {}; the token `{name}` is kept in {}.",
            credentials.server,
            credentials.username,
            path.display()
        );
    }
    Ok(())
}

pub async fn logout(context: &Context) -> Result<(), ClientError> {
    let Some(stored) = &context.stored else {
        context
            .output
            .note("Not signed in: there are no stored credentials.");
        if context.output.structured() {
            context.output.value(&json!({ "signedOut": false }));
        }
        return Ok(());
    };
    // The token is revoked where it was made, whatever --server says.
    let api = context
        .api
        .with_server(&stored.server)?
        .with_token(Some(stored.token.clone()));
    let revoked = api.request("mutation { logout }", json!({})).await;
    credentials::remove()?;
    match revoked {
        Ok(_) => {}
        // Revoked or expired already: nothing left to revoke.
        Err(ClientError::Api { code, .. }) if code == "UNAUTHENTICATED" => {}
        Err(e) => {
            return Err(match e {
                ClientError::Transport(message) => ClientError::Transport(format!(
                    "removed the credentials, but could not revoke their token on {} \
                     (revoke it in the console): {message}",
                    stored.server
                )),
                other => other,
            });
        }
    }
    if context.output.structured() {
        context
            .output
            .value(&json!({ "signedOut": true, "server": stored.server }));
    } else {
        println!(
            "Signed out of {}: the token is revoked and the credentials removed.",
            stored.server
        );
    }
    Ok(())
}

/// `cli@<host>`: which machine a token is for, as the console lists it.
fn token_name() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    format!("cli@{host}")
}

fn ask_username() -> Result<String, ClientError> {
    if !std::io::stdin().is_terminal() {
        return Err(ClientError::Usage(
            "no terminal to ask the user name on: give --user".to_owned(),
        ));
    }
    eprint!("User: ");
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| ClientError::Local(format!("reading the user name: {e}")))?;
    let name = line.trim().to_owned();
    if name.is_empty() {
        return Err(ClientError::Usage("no user name given".to_owned()));
    }
    Ok(name)
}

/// The password from stdin (`--password-stdin`, one trailing newline
/// dropped) or asked on the terminal without echo.
fn read_password(username: &str, server: &str, from_stdin: bool) -> Result<String, ClientError> {
    let password = if from_stdin {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| ClientError::Local(format!("reading the password from stdin: {e}")))?;
        let text = text.strip_suffix('\n').unwrap_or(&text);
        text.strip_suffix('\r').unwrap_or(text).to_owned()
    } else {
        if !std::io::stdin().is_terminal() {
            return Err(ClientError::Usage(
                "no terminal to ask the password on: pipe it in with --password-stdin".to_owned(),
            ));
        }
        rpassword::prompt_password(format!("Password for {username} at {server}: "))
            .map_err(|e| ClientError::Local(format!("reading the password: {e}")))?
    };
    if password.is_empty() {
        return Err(ClientError::Usage("the password is empty".to_owned()));
    }
    Ok(password)
}
