//! Users and projects in real Chromium, and what the console hides from a
//! user by their roles: a server admin makes a user and a project in the
//! console (bad input refused where it was typed), writes a blueprint in the
//! project and adds the user as VIEWER; signed in, the user sees the project
//! read-only, no Users entry, no deploy or destroy controls on the
//! project's deployment, no blueprint editing, and on providers no create
//! button and no log. Promoted to DEPLOYER, the deploy controls appear (but
//! not blueprint editing); disabled by the admin, their session ends.

use serde_json::json;

use crate::support::browser::Browser;
use crate::support::{TestApp, data};

const USER_PASSWORD: &str = "vera-password-42";

const FITS: &str = "document.documentElement.scrollWidth <= 420";

/// True when nothing matches `css`, or all that matches is hidden.
fn none_shown(css: &str) -> String {
    format!("[...document.querySelectorAll('{css}')].every(e => !e.offsetParent)")
}

/// Nothing left out was drawn as the words `null` or `false`.
const NO_STRAY_TEXT: &str = "!/\\b(null|false)\\b/.test(document.querySelector('main').innerText)";

/// Waits until the page `module` is drawn (app.js marks it on `<body>`).
async fn ready(browser: &Browser, module: &str) {
    browser
        .wait_js(
            &format!("the {module} page is drawn"),
            &format!("document.body.dataset.ready === '{module}' && !document.querySelector('main[aria-busy]')"),
        )
        .await;
}

#[tokio::test]
async fn an_admin_makes_a_user_and_a_project_and_the_console_shows_the_user_what_their_role_allows()
{
    let app = TestApp::spawn().await;
    let admin = Browser::sign_in(&app).await;
    admin.wait_text("#top nav", "Users").await;

    // A user, after a name the server refuses.
    admin.goto("/users/new").await;
    admin.fill("#user-form [name=username]", "Vera!").await;
    admin
        .fill("#user-form [name=password]", USER_PASSWORD)
        .await;
    admin.click("#user-form button[type=submit]").await;
    admin
        .wait_text("#user-form [role=alert]", "VALIDATION")
        .await;
    admin.fill("#user-form [name=username]", "vera").await;
    admin.click("#user-form button[type=submit]").await;
    admin.wait_text("h1", "vera").await;
    let user_page = admin.path().await;
    assert!(user_page.starts_with("/users/"), "{user_page}");
    admin.goto("/users").await;
    admin.wait_text("#users [data-username=vera]", "USER").await;

    // A project with limits; a quota without a number is refused in the page.
    admin.goto("/projects/new").await;
    admin.fill("#project-form [name=name]", "shop").await;
    admin.fill("#project-form [name=maxResources]", "5").await;
    admin.click("#add-quota").await;
    admin.fill("#quota-rows [name=quota-key]", "cpu").await;
    admin.click("#project-form button[type=submit]").await;
    admin
        .wait_text(
            "#project-form [role=alert]",
            "quotas.cpu: a limit is required",
        )
        .await;
    admin.fill("#quota-rows [name=quota-value]", "8").await;
    admin.click("#project-form button[type=submit]").await;
    admin.wait_text("h1", "shop").await;
    admin.wait_text("[data-field=quotas]", "cpu ≤ 8").await;
    admin.wait_text("[data-field=usage]", "0 of 5").await;
    let project = admin
        .path()
        .await
        .trim_start_matches("/projects/")
        .to_owned();

    // A member by username: an unknown one is refused beside the form.
    admin.fill("#add-member [name=username]", "nobody").await;
    admin.click("#add-member button[type=submit]").await;
    admin
        .wait_text("#add-member [role=alert]", "no user named `nobody`")
        .await;
    admin.fill("#add-member [name=username]", "vera").await;
    admin.click("#add-member button[type=submit]").await;
    admin
        .wait_text("#member-list [data-member=vera]", "vera")
        .await;
    admin
        .wait_attr("#member-list [data-member=vera]", "data-role", "VIEWER")
        .await;
    admin.screenshot("project-admin").await;

    // A blueprint written in the project, chosen among the admin's.
    admin.goto("/blueprints/new").await;
    admin.select("#bp-project", &project).await;
    admin.fill("#bp-name", "shop-web").await;
    admin.click("#bp-save").await;
    admin.wait_text("h1", "shop-web").await;
    admin.wait_text("main p", "project shop").await;
    let blueprint = admin
        .path()
        .await
        .trim_start_matches("/blueprints/")
        .to_owned();
    let body = app
        .gql(
            "query($id: ID!) { blueprint(id: $id) { projectId } }",
            json!({ "id": blueprint }),
        )
        .await;
    assert_eq!(data(&body)["blueprint"]["projectId"], project.as_str());
    // Deployed through the API: no provider serves its type, which does not
    // matter to what the page offers.
    let body = app
        .gql(
            "mutation($b: ID!) { deployBlueprint(input: { blueprintId: $b, name: \"shop-one\" }) { id } }",
            json!({ "b": blueprint }),
        )
        .await;
    let deployment = data(&body)["deployBlueprint"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let body = app
        .gql(
            "mutation { createProvider(input: { name: \"far\", gitUrl: \"https://git.example.com/far.git\", autoLoad: false }) { provider { id } } }",
            json!({}),
        )
        .await;
    let provider = data(&body)["createProvider"]["provider"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let source = tempfile::tempdir().unwrap();
    let body = app
        .gql(
            "mutation($p: String!) { createRepository(input: { name: \"mirror\", driver: { local: { path: $p } } }) { id } }",
            json!({ "p": source.path() }),
        )
        .await;
    let repository = data(&body)["createRepository"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The admin is offered what changes the repository.
    admin.goto(&format!("/repositories/{repository}")).await;
    ready(&admin, "repositories").await;
    for css in ["#refresh", "#settings", "#delete-repository"] {
        admin.find(css).await;
    }
    admin.wait_js("no stray text", NO_STRAY_TEXT).await;

    // The viewer, on a 420 px screen: the project read-only, no Users entry.
    let user = Browser::open_sized(&app, 420).await;
    user.sign_in_as("vera", USER_PASSWORD).await;
    ready(&user, "overview").await;
    let nav = user.text("#top nav").await;
    assert!(nav.contains("Projects") && !nav.contains("Users"), "{nav}");
    user.goto("/projects").await;
    user.wait_text("#projects [data-name=shop]", "VIEWER").await;
    user.click("#projects a").await;
    user.wait_text("h1", "shop").await;
    user.wait_text("#read-only", "VIEWER").await;
    user.wait_text("#project-blueprints", "shop-web").await;
    user.wait_text("#project-deployments", "shop-one").await;
    for css in [
        "#add-member",
        "#project-settings",
        "#delete-project",
        "#member-list select",
        "[data-remove]",
    ] {
        assert!(user.all(css).await.is_empty(), "a viewer is shown {css}");
    }
    user.wait_js("the project page fits", FITS).await;
    user.wait_js("no stray text", NO_STRAY_TEXT).await;

    // Its deployment: the project named, no deploy, destroy or lease.
    user.goto(&format!("/deployments/{deployment}")).await;
    ready(&user, "deployments").await;
    user.wait_text("[data-field=project]", "shop").await;
    user.wait_js("the deployment page fits", FITS).await;
    user.wait_js("no stray text", NO_STRAY_TEXT).await;
    for css in ["#destroy", "#redeploy", "#extend", "[id^=power-]"] {
        user.wait_js(&format!("no {css}"), &none_shown(css)).await;
    }
    user.goto("/deployments").await;
    user.wait_text("#deployment-list", "shop-one").await;
    user.wait_js("no deploy button", &none_shown("#deploy-new"))
        .await;
    // Its blueprint: read-only, not deployable.
    user.goto(&format!("/blueprints/{blueprint}")).await;
    ready(&user, "blueprints").await;
    user.wait_js(
        "the source is read-only",
        "document.querySelector('#bp-source').readOnly",
    )
    .await;
    for css in ["#bp-save", "#bp-delete", "#bp-deploy"] {
        user.wait_js(&format!("no {css}"), &none_shown(css)).await;
    }
    // Providers: readable, but no create button, actions or log.
    user.goto("/providers").await;
    user.wait_text("#provider-list", "far").await;
    user.wait_js("no add button", &none_shown("#add-provider"))
        .await;
    user.goto(&format!("/providers/{provider}")).await;
    user.wait_text("#provider-log-note", "server admins").await;
    for css in [
        "#provider-logs",
        "#load",
        "#delete",
        "#edit-config",
        ".error",
    ] {
        user.wait_js(&format!("no {css}"), &none_shown(css)).await;
    }
    user.wait_js("no stray text", NO_STRAY_TEXT).await;
    user.screenshot("provider-as-viewer-narrow").await;
    // Repositories: readable, no add, refresh, settings or delete.
    user.goto("/repositories").await;
    user.wait_text("#repositories", "mirror").await;
    user.wait_js("no add button", &none_shown("#add-repository"))
        .await;
    user.goto(&format!("/repositories/{repository}")).await;
    ready(&user, "repositories").await;
    user.wait_text("h1", "mirror").await;
    for css in ["#refresh", "#settings", "#delete-repository"] {
        user.wait_js(&format!("no {css}"), &none_shown(css)).await;
    }
    user.wait_js("no stray text", NO_STRAY_TEXT).await;
    // Users: refused, with no button a user cannot use; a mistyped address
    // is the console's "Not found".
    user.goto("/users").await;
    user.wait_text("#user-list", "FORBIDDEN").await;
    user.wait_js("no new user button", &none_shown("#new-user"))
        .await;
    user.goto("/no-such-page").await;
    user.wait_text("h1", "Not found").await;

    // The admin makes them DEPLOYER in the project's page.
    admin.goto(&format!("/projects/{project}")).await;
    admin
        .select("#member-list [data-member=vera] select", "DEPLOYER")
        .await;
    admin
        .wait_attr("#member-list [data-member=vera]", "data-role", "DEPLOYER")
        .await;

    // The deploy actions appear; editing the blueprint still does not.
    user.goto(&format!("/deployments/{deployment}")).await;
    ready(&user, "deployments").await;
    user.find("#redeploy").await;
    user.find("#extend").await;
    user.wait_js(
        "destroy is offered",
        "(document.querySelector('#deployment-state')?.dataset.state === 'DESTROYED') || !!document.querySelector('#destroy').offsetParent",
    )
    .await;
    user.goto(&format!("/blueprints/{blueprint}")).await;
    user.find("#bp-deploy").await;
    user.wait_js("still no save", &none_shown("#bp-save")).await;
    user.goto("/deployments").await;
    user.find("#deploy-new").await;
    user.screenshot("deployer").await;

    // Disabled in the console, the user's session ends at their next step.
    admin.goto(&user_page).await;
    admin.wait_text("#toggle-disabled", "Disable").await;
    admin.click("#toggle-disabled").await;
    admin.wait_text("[data-field=disabled]", "disabled").await;
    admin.wait_text("#toggle-disabled", "Enable").await;
    user.click("#top nav a[href='/projects']").await;
    user.find("#sign-in").await;
    assert!(
        user.path().await.starts_with("/sign-in?next="),
        "{}",
        user.path().await
    );

    // Deleting the user needs their name typed.
    admin.click("#delete-user").await;
    admin
        .wait_attr("#delete-user-confirm", "disabled", "true")
        .await;
    admin.fill("#delete-user-name", "vera").await;
    admin.click("#delete-user-confirm").await;
    admin.wait_text("h1", "Users").await;
    admin
        .wait_js("vera is gone", &none_shown("#users [data-username=vera]"))
        .await;
    user.close().await;
    admin.close().await;
}
