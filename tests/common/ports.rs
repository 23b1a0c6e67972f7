//! Loopback ports for the servers a test starts (a runner's endpoint, Caddy, the bridges).

/// A free loopback port, never handed out before in this process. Binding port 0 finds one, but once
/// its listener is closed the kernel may give the same port out again (4 times in 20,000 binds in a
/// row on the build machine): two Caddys started at once, by one test or by two, then met on one port,
/// and one's admin API answered the requests meant for the other's sites (403 "host not allowed").
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if GIVEN.lock().unwrap().insert(port) {
            return port;
        }
    }
}
