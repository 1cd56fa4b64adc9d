//! One worker's list of idle connections to one backend: the most recently used on top, and the
//! surplus over the pool size closed once it has gone unused for a while.
//!
//! `upstream_keepalive_pool_size` bounds the idle connections a backend keeps. A burst with more
//! requests in flight than that gives more connections back at once; closing the surplus as it
//! comes back (nginx's way) makes the next burst open them again. At 10,000 client connections
//! the sweep's proxy opened 50,000-100,000 backend connections for a million requests that way,
//! each an accept and a close for the backend. Here the surplus stays on the list until it has
//! gone a whole [`SURPLUS_GRACE`] untouched, and is then closed, the longest idle first: no more
//! connections are ever open than were in use at once, and the idle ones above the pool size
//! outlive the burst that needed them by one to two grace periods.
//!
//! Requests take from the top, so the connections at the bottom are the ones no request has
//! needed: the list remembers how deep takes have reached since the last trim, and everything
//! below that depth has been idle all along.

use std::time::Duration;

/// How long a connection above the pool size may stay idle before it is closed.
pub const SURPLUS_GRACE: Duration = Duration::from_secs(1);

/// Idle connections, most recently returned last.
pub struct IdleList<T> {
    items: Vec<T>,
    /// The bottom `untouched` items have stayed on the list since the trim was armed or last ran.
    untouched: usize,
    /// A trim is due: the list went over the pool size and has not come back under it since.
    trim_armed: bool,
}

impl<T> Default for IdleList<T> {
    fn default() -> Self {
        IdleList {
            items: Vec::new(),
            untouched: 0,
            trim_armed: false,
        }
    }
}

impl<T> IdleList<T> {
    /// Puts `item` on top. Within `size` it is simply kept; above it only if `surplus_allowed()`
    /// (asked only then). `Ok(true)`: kept above the size, and a [`IdleList::trim`] is now due a
    /// grace period on (the caller arranges it; later keeps above the size find it armed).
    /// `Err(item)`: not kept (a `size` of 0 keeps nothing), for the caller to close.
    pub fn keep(
        &mut self,
        item: T,
        size: usize,
        surplus_allowed: impl FnOnce() -> bool,
    ) -> Result<bool, T> {
        if self.items.len() < size {
            self.items.push(item);
            return Ok(false);
        }
        if size == 0 || !surplus_allowed() {
            return Err(item);
        }
        self.items.push(item);
        let arm = !self.trim_armed;
        if arm {
            self.trim_armed = true;
            self.untouched = self.items.len();
        }
        Ok(arm)
    }

    /// The top item.
    pub fn pop(&mut self) -> Option<T> {
        let item = self.items.pop()?;
        self.touched_at(self.items.len());
        Some(item)
    }

    /// Takes the highest item that `pick` accepts (the top one left in its place).
    pub fn take_last(&mut self, pick: impl Fn(&T) -> bool) -> Option<T> {
        let at = self.items.iter().rposition(pick)?;
        let item = self.items.swap_remove(at);
        self.touched_at(at);
        Some(item)
    }

    /// Closes (hands back) the surplus over `size` that has stayed untouched since the last
    /// trim, the bottom first. Returns it, and whether the list is still over `size` (another
    /// trim is due a grace period on).
    pub fn trim(&mut self, size: usize) -> (Vec<T>, bool) {
        let surplus = self.items.len().saturating_sub(size);
        let closing = surplus.min(self.untouched);
        let closed = self.items.drain(..closing).collect();
        self.untouched = self.items.len();
        self.trim_armed = self.items.len() > size;
        (closed, self.trim_armed)
    }

    /// Takes off the items `gone` says are of no more use (closed by the other side), wherever
    /// they are, and returns them; the others keep their order.
    pub fn remove_gone(&mut self, mut gone: impl FnMut(&mut T) -> bool) -> Vec<T> {
        let mut removed = Vec::new();
        let mut index = 0;
        while index < self.items.len() {
            if !gone(&mut self.items[index]) {
                index += 1;
                continue;
            }
            removed.push(self.items.remove(index));
            if index < self.untouched {
                self.untouched -= 1;
            }
        }
        removed
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.items.len()
    }

    fn touched_at(&mut self, at: usize) {
        self.untouched = self.untouched.min(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gone_items_leave_from_anywhere_and_the_untouched_count_follows() {
        // The first three stay untouched from the keep that went over the size.
        let mut list = list_of(2, 0..6);
        assert_eq!(list.untouched, 3);
        let gone = list.remove_gone(|item| *item % 2 == 1);
        assert_eq!(gone, vec![1, 3, 5]);
        assert_eq!(list.items, vec![0, 2, 4]);
        assert_eq!(list.untouched, 2, "0 and 2 are still the untouched bottom");
        // The trim still closes only the surplus no request has touched.
        let (closed, still_over) = list.trim(2);
        assert_eq!((closed, still_over), (vec![0], false));
        assert!(list.remove_gone(|_| false).is_empty());
    }

    fn list_of(size: usize, items: std::ops::Range<u32>) -> IdleList<u32> {
        let mut list = IdleList::default();
        for i in items {
            let _ = list.keep(i, size, || true);
        }
        list
    }

    #[test]
    fn within_the_pool_size_nothing_is_armed_or_closed() {
        let mut list = IdleList::default();
        assert_eq!(list.keep(1, 2, || unreachable!()), Ok(false));
        assert_eq!(list.keep(2, 2, || unreachable!()), Ok(false));
        assert_eq!(list.trim(2), (vec![], false));
        assert_eq!(list.len(), 2);
    }

    #[test]
    fn the_first_keep_over_the_size_arms_one_trim() {
        let mut list = IdleList::default();
        assert_eq!(list.keep(1, 1, || true), Ok(false));
        assert_eq!(list.keep(2, 1, || true), Ok(true));
        assert_eq!(list.keep(3, 1, || true), Ok(false));
        assert_eq!(list.len(), 3);
    }

    #[test]
    fn no_pool_or_no_surplus_allowed_refuses() {
        let mut none = IdleList::default();
        assert_eq!(none.keep(1, 0, || true), Err(1));
        let mut full = list_of(1, 0..1);
        assert_eq!(full.keep(2, 1, || false), Err(2));
        assert_eq!(full.len(), 1);
    }

    #[test]
    fn an_untouched_surplus_is_closed_oldest_first_down_to_the_size() {
        let mut list = list_of(2, 0..5);
        // Armed when the third went on: those three have been there all along and go, which
        // leaves the two that arrived since: the size, so nothing more is due.
        assert_eq!(list.trim(2), (vec![0, 1, 2], false));
        assert_eq!(list.len(), 2);
        assert_eq!(list.pop(), Some(4));
    }

    #[test]
    fn connections_a_burst_reached_for_are_not_surplus() {
        let mut list = list_of(2, 0..6);
        // Armed with 0..=2 untouched: a burst took the top four, then gave four back.
        for _ in 0..4 {
            list.pop();
        }
        for i in 10..14 {
            let _ = list.keep(i, 2, || true);
        }
        // Only the bottom two stayed untouched all the period: they go, the four given back stay.
        assert_eq!(list.trim(2), (vec![0, 1], true));
        // A quiet period later the oldest of those go, down to the size.
        assert_eq!(list.trim(2), (vec![10, 11], false));
        assert_eq!(list.pop(), Some(13));
    }

    #[test]
    fn a_take_from_the_middle_counts_as_reaching_that_deep() {
        let mut list = list_of(1, 0..4);
        assert_eq!(list.take_last(|&i| i == 1), Some(1));
        // 3 moved into 1's place: only item 0, below it, stayed untouched.
        assert_eq!(list.trim(1), (vec![0], true));
        assert_eq!(list.trim(1), (vec![3], false));
    }
}
