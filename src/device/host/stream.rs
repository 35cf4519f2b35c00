//! Streams and events of the host backend.
//!
//! A stream is a worker thread draining a FIFO. `synchronize` waits until every item pushed
//! before it has run. An event counts records (generations): `record` takes the next
//! generation at enqueue time and the worker marks it complete when it reaches that point;
//! `wait(g)` blocks the calling worker until generation `g` is complete, which is exactly the
//! semantics of `cuEventRecord` / `cuStreamWaitEvent`.

use crate::device::{DeviceError, DeviceResult};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub type Job = Box<dyn FnOnce() -> Result<(), String> + Send>;

struct Queue {
    jobs: VecDeque<Job>,
    /// Items pushed / items finished: synchronize waits for finished to reach pushed.
    pushed: u64,
    finished: u64,
    /// First failure since the last synchronize. Later items still run: skipping them would
    /// also skip event records and leave other streams waiting forever.
    error: Option<String>,
    shutdown: bool,
}

pub struct Stream {
    id: u32,
    queue: Mutex<Queue>,
    work_ready: Condvar,
    progress: Condvar,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Stream {
    pub fn spawn(id: u32, jitter_us: u32, seed: u64) -> Arc<Stream> {
        let stream = Arc::new(Stream {
            id,
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                pushed: 0,
                finished: 0,
                error: None,
                shutdown: false,
            }),
            work_ready: Condvar::new(),
            progress: Condvar::new(),
            worker: Mutex::new(None),
        });
        let worker_stream = Arc::clone(&stream);
        let handle = std::thread::Builder::new()
            .name(format!("gkrt-host-stream-{id}"))
            .spawn(move || worker_stream.run(jitter_us, seed))
            .expect("spawning a host stream worker");
        *stream.worker.lock().unwrap() = Some(handle);
        stream
    }

    pub fn push(&self, job: Job) {
        let mut q = self.queue.lock().unwrap();
        q.jobs.push_back(job);
        q.pushed += 1;
        self.work_ready.notify_one();
    }

    pub fn synchronize(&self) -> DeviceResult<()> {
        let mut q = self.queue.lock().unwrap();
        let target = q.pushed;
        while q.finished < target {
            q = self.progress.wait(q).unwrap();
        }
        match q.error.take() {
            Some(e) => Err(DeviceError::Async(e)),
            None => Ok(()),
        }
    }

    /// Blocks until everything pushed so far has run, leaving any error for `synchronize`.
    pub fn wait_idle(&self) {
        let mut q = self.queue.lock().unwrap();
        let target = q.pushed;
        while q.finished < target {
            q = self.progress.wait(q).unwrap();
        }
    }

    /// Drains the queue and joins the worker.
    pub fn shutdown(&self) {
        {
            let mut q = self.queue.lock().unwrap();
            q.shutdown = true;
            self.work_ready.notify_all();
        }
        if let Some(h) = self.worker.lock().unwrap().take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    fn run(&self, jitter_us: u32, seed: u64) {
        let mut rng = seed | 1;
        loop {
            let job = {
                let mut q = self.queue.lock().unwrap();
                loop {
                    if let Some(job) = q.jobs.pop_front() {
                        break job;
                    }
                    if q.shutdown {
                        return;
                    }
                    q = self.work_ready.wait(q).unwrap();
                }
            };
            if jitter_us > 0 {
                // xorshift64: cheap, deterministic per seed.
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                std::thread::sleep(Duration::from_micros(rng % (jitter_us as u64 + 1)));
            }
            // A panicking job must not kill the worker (synchronize would then hang forever).
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))
                .unwrap_or_else(|_| Err(format!("a job on host stream {} panicked", self.id)));
            let mut q = self.queue.lock().unwrap();
            if let Err(e) = result {
                q.error.get_or_insert(e);
            }
            q.finished += 1;
            self.progress.notify_all();
        }
    }
}

struct EventState {
    recorded: u64,
    completed: u64,
    completed_at: Option<Duration>,
}

pub struct Event {
    state: Mutex<EventState>,
    changed: Condvar,
    epoch: Instant,
}

impl Event {
    pub fn new(epoch: Instant) -> Event {
        Event {
            state: Mutex::new(EventState {
                recorded: 0,
                completed: 0,
                completed_at: None,
            }),
            changed: Condvar::new(),
            epoch,
        }
    }

    pub fn begin_record(&self) -> u64 {
        let mut s = self.state.lock().unwrap();
        s.recorded += 1;
        s.recorded
    }

    pub fn recorded_generation(&self) -> u64 {
        self.state.lock().unwrap().recorded
    }

    pub fn complete(&self, generation: u64) {
        let mut s = self.state.lock().unwrap();
        if generation > s.completed {
            s.completed = generation;
            s.completed_at = Some(self.epoch.elapsed());
        }
        self.changed.notify_all();
    }

    pub fn is_complete(&self, generation: u64) -> bool {
        self.state.lock().unwrap().completed >= generation
    }

    pub fn wait(&self, generation: u64) {
        let mut s = self.state.lock().unwrap();
        while s.completed < generation {
            s = self.changed.wait(s).unwrap();
        }
    }

    pub fn completed_at(&self) -> Option<Duration> {
        let s = self.state.lock().unwrap();
        if s.completed == s.recorded {
            s.completed_at
        } else {
            None
        }
    }
}
