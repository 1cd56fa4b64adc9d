//! A cap on one client address's connections to a listener ([`PerClient`]), for the listeners
//! whose whole cap is small (the admin API's 64): without it, one address that holds its
//! connections open (a slowloris reconnecting as each is cut) takes every place, and the
//! monitoring, the cluster's pushes and the operator are shut out. The proxy's listeners have
//! none: their cap is `max_connections`, and clients behind one NAT share an address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// How many connections each client address holds.
#[derive(Debug)]
pub struct PerClient {
    max: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place among its address's, given back when dropped.
#[derive(Debug)]
pub struct ClientSlot {
    table: Arc<PerClient>,
    ip: IpAddr,
}

impl PerClient {
    pub fn new(max: usize) -> Arc<PerClient> {
        Arc::new(PerClient {
            max,
            open: Mutex::default(),
        })
    }

    /// A place for a connection from `ip`, if it holds fewer than the cap.
    pub fn take(self: &Arc<Self>, ip: IpAddr) -> Option<ClientSlot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(ip).or_default();
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(ClientSlot {
            table: self.clone(),
            ip,
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.table.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_its_places_back_as_its_connections_end() {
        let table = PerClient::new(2);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = table.take(a).expect("a place");
        let _second = table.take(a).expect("a place");
        assert!(table.take(a).is_none(), "a third from the same address");
        assert!(table.take(b).is_some(), "another address has its own");
        drop(first);
        assert!(table.take(a).is_some(), "a place came back");
        drop(table.take(b));
        assert!(
            !table.open.lock().unwrap().contains_key(&b),
            "no entry left for an address"
        );
    }
}
