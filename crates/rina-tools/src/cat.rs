//! `rina-cat`: a netcat for RINA flows. Bytes of an input (standard
//! input) go onto a flow, each read one SDU; SDUs of the flow go to an
//! output (standard output) as they come, flushed after each. A direction
//! each on a thread of its own, with blocking reads and writes, as in
//! [`crate::gw::session`].
//!
//! The input is read by one thread for the whole process ([`Input`]),
//! which writes it on each session's flow in turn: a listener that takes
//! flows one after another (`--keep-listening`) has one standard input.
//! A read that the flow did not take before it ended goes on the next
//! one; what a flow took while its peer was ending it is lost with it (the
//! daemon drops what is written on a flow that has ended), and an input
//! that fails between sessions fails the next one.
//!
//! How a session ends:
//! * the flow's end (the peer closed it, or this side did) ends the
//!   session once every SDU that came on it was written out: the far
//!   daemon keeps the flow's end open until its application has taken
//!   what was delivered, so nothing written before the close is lost;
//! * the end of the input closes the flow, at once or after a wait, or
//!   leaves it open, as [`InputEnd`] says (a caller closes, a listener
//!   leaves the end to its peer);
//! * an output that went away (`| head`) or a failure ends it too, and the
//!   flow with it.

use rina::Flow;
use std::io::{self, Read, Write};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Largest SDU written from the input, whatever the flow's largest: one
/// read rarely brings more, and the buffer is allocated per session.
pub const MAX_CHUNK: usize = 64 << 10;

/// What the end of the input does to the session's flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputEnd {
    /// Close the flow this long after the input ended, or when the flow
    /// ends, if sooner (a caller: at once, or after `--wait-ms`). What
    /// was written before is still delivered in full.
    CloseAfter(Duration),
    /// Leave the flow open: its end is the peer's (a listener, whose
    /// standard input may be `/dev/null`; a caller with `--no-stdin`).
    KeepOpen,
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The flow ended (closed by the peer, or at the end of the input),
    /// and everything that came on it was written out.
    Closed,
    /// The output was closed (its reader went away): the flow was closed
    /// with what it still had to give.
    OutputGone,
    /// Something failed: what, and how.
    Failed(String),
}

/// What one session carried, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    /// Bytes from the input onto the flow.
    pub sent: u64,
    /// Bytes from the flow onto the output.
    pub received: u64,
    /// How it ended.
    pub end: End,
}

/// A session's state, shared by its two directions.
#[derive(Debug, Default)]
struct State {
    /// Bytes written on the flow from the input.
    sent: u64,
    /// The flow's reader is done: the session is over.
    over: bool,
    /// What failed on the input's side, if anything did.
    error: Option<String>,
}

/// A [`State`] and the condition the input's side waits on for its end.
#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    over: Condvar,
}

impl Shared {
    /// The state, even if a thread panicked holding it (counters only).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One session, as the input's thread gets it.
#[derive(Debug)]
struct Session {
    flow: Arc<Flow>,
    shared: Arc<Shared>,
}

/// The thread that reads the input and writes it on each session's flow
/// in turn (see [`Input::start`]).
#[derive(Debug)]
pub struct Input {
    sessions: mpsc::Sender<Session>,
}

impl Input {
    /// Starts the thread reading `input` (it reads nothing before the
    /// first session), which does what `end` says when the input ends.
    pub fn start<R: Read + Send + 'static>(input: R, end: InputEnd) -> io::Result<Input> {
        let (sessions, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("rina-cat-input".into())
            .spawn(move || feed(input, end, rx))?;
        Ok(Input { sessions })
    }
}

/// How feeding one session's flow ended.
#[derive(Debug)]
enum Fed {
    /// The flow ended; what was read and not written stays for the next.
    FlowEnded,
    /// The input ended.
    InputEnded,
    /// Reading the input failed: the input is done.
    InputFailed(String),
    /// Writing on the flow failed (not for its end).
    WriteFailed(String),
}

/// The input thread: writes `input` on the flow of each session that
/// comes, until the input ends or fails.
fn feed<R: Read>(mut input: R, end: InputEnd, sessions: mpsc::Receiver<Session>) {
    let mut held = Vec::new();
    while let Ok(s) = sessions.recv() {
        match feed_session(&mut input, &mut held, &s) {
            Fed::FlowEnded => {}
            Fed::InputEnded => {
                if let InputEnd::CloseAfter(wait) = end {
                    close_after(&s, wait);
                }
                return;
            }
            Fed::InputFailed(e) => {
                // Read for a session that ended meanwhile: the next one
                // says so.
                if !fail(&s, e.clone()) {
                    if let Ok(next) = sessions.recv() {
                        fail(&next, e);
                    }
                }
                return;
            }
            Fed::WriteFailed(e) => {
                fail(&s, e);
            }
        }
    }
}

/// Writes `input` on `s`'s flow, one SDU per read (at most the flow's
/// largest and [`MAX_CHUNK`]), until the input or the flow ends. `held`
/// is what was read and not yet written: it goes first, and stays there
/// if the flow ends before it went.
fn feed_session<R: Read>(input: &mut R, held: &mut Vec<u8>, s: &Session) -> Fed {
    let max = s.flow.max_sdu().clamp(1, MAX_CHUNK);
    let mut buf = vec![0u8; max];
    loop {
        if held.is_empty() {
            match input.read(&mut buf) {
                Ok(0) => return Fed::InputEnded,
                Ok(n) => held.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Fed::InputFailed(format!("reading standard input: {e}")),
            }
        }
        while !held.is_empty() {
            let n = held.len().min(max);
            // Held while writing: the session's end (which shuts the flow
            // down first, so that a blocked write returns) then counts
            // every byte written.
            let mut state = s.shared.lock();
            if state.over {
                return Fed::FlowEnded;
            }
            match s.flow.write(&held[..n]) {
                Ok(()) => {
                    state.sent += n as u64;
                    held.drain(..n);
                }
                Err(e) if e.is_closed() => return Fed::FlowEnded,
                Err(e) => return Fed::WriteFailed(format!("writing to the flow: {e}")),
            }
        }
    }
}

/// Closes `s`'s flow after `wait`, or at once when the session is over
/// before.
fn close_after(s: &Session, wait: Duration) {
    let state = s.shared.lock();
    // A poisoned lock still says whether the session is over.
    let _ = s.shared.over.wait_timeout_while(state, wait, |st| !st.over);
    s.flow.shutdown();
}

/// Ends session `s` for `why`: its reader then reports it. False if the
/// session was already over (nobody would report it).
fn fail(s: &Session, why: String) -> bool {
    let mut state = s.shared.lock();
    if state.over {
        return false;
    }
    state.error.get_or_insert(why);
    drop(state);
    s.flow.shutdown();
    true
}

/// Carries one session on `flow`: the [`Input`]'s thread writes on it,
/// and its SDUs are written to `out` (flushed after each) until it ends;
/// then the flow is closed (if it was not already): what it carried.
pub fn carry<W: Write>(flow: Flow, input: &Input, out: W) -> Carried {
    let flow = Arc::new(flow);
    let shared = Arc::new(Shared::default());
    // The input may be over (ended, or failed): the session gets none.
    let _ = input.sessions.send(Session {
        flow: Arc::clone(&flow),
        shared: Arc::clone(&shared),
    });
    let (received, end) = flow_to_output(&flow, out);
    // A write the input's side is blocked in returns, and its count is
    // taken after.
    flow.shutdown();
    let mut state = shared.lock();
    state.over = true;
    shared.over.notify_all();
    let end = match (end, state.error.take()) {
        (End::Closed, Some(e)) => End::Failed(e),
        (end, _) => end,
    };
    Carried {
        sent: state.sent,
        received,
        end,
    }
}

/// SDUs of `flow` onto `out`, flushed after each, until the flow ends or
/// `out` fails: the bytes written, and how it ended.
fn flow_to_output<W: Write>(flow: &Flow, mut out: W) -> (u64, End) {
    let mut buf = vec![0u8; flow.max_sdu().max(1)];
    let mut total = 0u64;
    loop {
        let n = match flow.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.is_closed() => return (total, End::Closed),
            Err(e) => return (total, End::Failed(format!("reading the flow: {e}"))),
        };
        if let Err(e) = out.write_all(&buf[..n]).and_then(|()| out.flush()) {
            let end = if e.kind() == io::ErrorKind::BrokenPipe {
                End::OutputGone
            } else {
                End::Failed(format!("writing standard output: {e}"))
            };
            return (total, end);
        }
        total += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::flows;
    use std::time::Instant;

    /// A reader whose reads are the chunks sent to it; its end when the
    /// sender is dropped.
    struct Chunks(mpsc::Receiver<Vec<u8>>);

    impl Read for Chunks {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let Ok(c) = self.0.recv() else { return Ok(0) };
            buf[..c.len()].copy_from_slice(&c);
            Ok(c.len())
        }
    }

    /// A writer that is always closed.
    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Reads SDUs on `peer` until the flow ends: their bytes, checking
    /// that none is over `max`.
    fn read_to_end(peer: &Flow, max: usize) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 1 << 17];
        while let Ok(n) = peer.read(&mut buf) {
            assert!(n <= max, "an SDU of {n} bytes on a flow of {max}");
            got.extend_from_slice(&buf[..n]);
        }
        got
    }

    #[test]
    fn the_input_goes_on_the_flow_in_sdus_and_its_end_closes_it() {
        let sent: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        let input = Input::start(
            io::Cursor::new(sent.clone()),
            InputEnd::CloseAfter(Duration::ZERO),
        );
        let (flow, peer) = flows(1000, 1000);
        peer.write(b"before the end").unwrap();
        let reader = std::thread::spawn(move || read_to_end(&peer, 1000));
        let mut out = Vec::new();
        let c = carry(flow, &input.unwrap(), &mut out);
        assert_eq!(reader.join().unwrap(), sent);
        assert_eq!((c.sent, c.end), (50_000, End::Closed));
        // What came before the close was written, or not, but never torn.
        assert!(out.is_empty() || out == b"before the end", "{out:?}");
    }

    #[test]
    fn a_listener_s_flow_outlives_its_input_and_ends_with_the_peer() {
        let input = Input::start(io::empty(), InputEnd::KeepOpen).unwrap();
        let (flow, peer) = flows(1000, 1000);
        let peer = std::thread::spawn(move || {
            // Long after the input ended, the flow is still open.
            std::thread::sleep(Duration::from_millis(50));
            for _ in 0..10 {
                peer.write(&[7u8; 1000]).unwrap();
            }
        });
        let mut out = Vec::new();
        let c = carry(flow, &input, &mut out);
        peer.join().unwrap();
        assert_eq!(out, vec![7u8; 10_000], "all that came, then the end");
        assert_eq!((c.sent, c.received, c.end), (0, 10_000, End::Closed));
    }

    #[test]
    fn a_wait_after_the_input_keeps_the_answer_coming_then_closes() {
        let wait = Duration::from_millis(300);
        let input = Input::start(&b"hello"[..], InputEnd::CloseAfter(wait)).unwrap();
        let (flow, peer) = flows(1000, 1000);
        let echo = std::thread::spawn(move || {
            let mut buf = [0u8; 1000];
            while let Ok(n) = peer.read(&mut buf) {
                let _ = peer.write(&buf[..n]);
            }
        });
        let start = Instant::now();
        let mut out = Vec::new();
        let c = carry(flow, &input, &mut out);
        assert!(
            start.elapsed() >= wait,
            "closed after {:?}",
            start.elapsed()
        );
        echo.join().unwrap();
        assert_eq!(out, b"hello");
        assert_eq!((c.sent, c.received, c.end), (5, 5, End::Closed));
    }

    #[test]
    fn the_flow_s_end_cuts_the_wait_short() {
        let input = Input::start(io::empty(), InputEnd::CloseAfter(Duration::from_secs(60)));
        let (flow, peer) = flows(1000, 1000);
        peer.write(b"bye").unwrap();
        drop(peer);
        let start = Instant::now();
        let mut out = Vec::new();
        let c = carry(flow, &input.unwrap(), &mut out);
        assert!(start.elapsed() < Duration::from_secs(30));
        assert_eq!((out.as_slice(), c.end), (&b"bye"[..], End::Closed));
    }

    #[test]
    fn a_closed_output_ends_the_session_and_the_flow() {
        let input = Input::start(io::empty(), InputEnd::KeepOpen).unwrap();
        let (flow, peer) = flows(1000, 1000);
        peer.write(b"nobody reads this").unwrap();
        let c = carry(flow, &input, Closed);
        assert_eq!((c.received, c.end), (0, End::OutputGone));
        assert!(peer.read(&mut [0u8; 100]).is_err(), "the flow still open");
    }

    #[test]
    fn an_input_that_fails_ends_the_session_saying_so() {
        struct Failing;
        impl Read for Failing {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("the disk is gone"))
            }
        }
        let input = Input::start(Failing, InputEnd::KeepOpen).unwrap();
        let (flow, _peer) = flows(1000, 1000);
        let c = carry(flow, &input, Vec::new());
        let End::Failed(why) = c.end else {
            panic!("{c:?}")
        };
        assert!(why.contains("standard input: the disk is gone"), "{why}");
    }

    /// The input fails while its thread reads for a session that ended
    /// meanwhile: the next session fails, saying why. Before, the error
    /// went to the session that was over, and every later session got no
    /// input and ended as if all was well.
    #[test]
    fn an_input_that_fails_between_sessions_fails_the_next() {
        struct FailsWhenTold(mpsc::Receiver<()>);
        impl Read for FailsWhenTold {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                let _ = self.0.recv();
                Err(io::Error::other("the disk is gone"))
            }
        }
        let (tell, told) = mpsc::channel();
        let input = Input::start(FailsWhenTold(told), InputEnd::KeepOpen).unwrap();
        let (flow, peer) = flows(1000, 1000);
        drop(peer);
        let first = carry(flow, &input, Vec::new());
        assert_eq!(first.end, End::Closed);
        tell.send(()).unwrap();
        let (flow, peer) = flows(1000, 1000);
        // Should the error not come, the peer ends the session later.
        let ender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(5));
            drop(peer);
        });
        let next = carry(flow, &input, Vec::new());
        drop(ender);
        let End::Failed(why) = next.end else {
            panic!("{next:?}")
        };
        assert!(why.contains("standard input: the disk is gone"), "{why}");
    }

    #[test]
    fn one_input_feeds_sessions_one_after_another() {
        let (tx, rx) = mpsc::channel();
        let input = Input::start(Chunks(rx), InputEnd::KeepOpen).unwrap();
        for (k, word) in [&b"one"[..], b"two"].into_iter().enumerate() {
            // A flow of 2-byte SDUs: the first carries 1000.
            let (flow, peer) = flows(if k == 0 { 1000 } else { 2 }, 1000);
            tx.send(word.to_vec()).unwrap();
            let peer = std::thread::spawn(move || {
                let mut got = Vec::new();
                let mut buf = [0u8; 100];
                while got.len() < 3 {
                    let n = peer.read(&mut buf).unwrap();
                    got.extend_from_slice(&buf[..n]);
                }
                got
            });
            let c = carry(flow, &input, Vec::new());
            assert_eq!(peer.join().unwrap(), word, "session {k}");
            assert_eq!((c.sent, c.end), (3, End::Closed), "session {k}");
        }
    }
}
