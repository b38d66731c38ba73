//! A real nginx for the tests: one per test, on a free loopback port, serving a
//! temporary directory, with every path of its own under a temporary prefix.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Nginx {
    pub port: u16,
    child: Child,
    _prefix: tempfile::TempDir,
}

impl Nginx {
    pub fn start(root: &Path) -> Nginx {
        let prefix = tempfile::tempdir().expect("nginx prefix");
        let port = free_port();
        let p = prefix.path().display();
        let conf = format!(
            "daemon off;\nmaster_process on;\nworker_processes 1;\nuser root;\npid {p}/nginx.pid;\n\
             error_log {p}/error.log;\nevents {{ worker_connections 128; }}\nhttp {{\n\
             access_log off;\nclient_body_temp_path {p}/body;\nproxy_temp_path {p}/proxy;\n\
             fastcgi_temp_path {p}/fastcgi;\nuwsgi_temp_path {p}/uwsgi;\nscgi_temp_path {p}/scgi;\n\
             types {{ application/json json; text/yaml yaml; }}\ndefault_type application/octet-stream;\n\
             server {{ listen 127.0.0.1:{port}; root {root}; }}\n}}\n",
            root = root.display()
        );
        let conf_path = prefix.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let child = Command::new(nginx_binary())
            .arg("-c")
            .arg(&conf_path)
            .arg("-p")
            .arg(prefix.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nginx starts (is the nginx package installed?)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nginx did not listen on {port}");
            std::thread::sleep(Duration::from_millis(10));
        }
        Nginx {
            port,
            child,
            _prefix: prefix,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let pid = i32::try_from(self.child.id()).unwrap();
        // SAFETY: signalling our own child (nginx's master; it stops its worker).
        unsafe { libc::kill(pid, libc::SIGQUIT) };
        let _ = self.child.wait();
    }
}

fn nginx_binary() -> PathBuf {
    ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("nginx"))
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
