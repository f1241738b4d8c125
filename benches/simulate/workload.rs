//! The day's workload, drawn once from the seed before either run, so the strict and the fair run
//! replay exactly the same pushes at the same simulated minutes.
//!
//! Organisations of very different sizes; a morning ColdStart-like burst of the largest one's
//! automatic boefje tasks; object mutations through the day (more boefje tasks, for every
//! organisation at a rate that grows with the square root of its size, so a small organisation
//! still brings work every hour); a few user scans; cron schedules per organisation. Raw files
//! (normalizer tasks) are not drawn here: each completed boefje task brings one, as in OpenKAT.

/// A small deterministic generator (xorshift64*): the same seed, the same day.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // Zero is xorshift's fixed point; any other seed is used as given.
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// A uniform draw in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A draw that depends only on its inputs: a worker's nth task lasts as long in both runs.
pub fn mix(seed: u64, a: u64, b: u64) -> u64 {
    let mut r = Rng::new(
        seed ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_mul(0xC2B2_AE3D_27D4_EB4F),
    );
    r.next();
    r.next()
}

/// How organisations are told apart in the figures: by size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    Large,
    Medium,
    Small,
}

impl Class {
    pub const ALL: [Class; 3] = [Class::Large, Class::Medium, Class::Small];

    pub fn name(self) -> &'static str {
        match self {
            Class::Large => "large",
            Class::Medium => "medium",
            Class::Small => "small",
        }
    }
}

/// One organisation of the day.
pub struct Org {
    pub name: String,
    pub objects: usize,
    pub class: Class,
}

/// The boefjes tasks are drawn from, with their weights. Shodan is common on purpose: at the
/// burst's pace its rate limit binds, so the held tasks have something to show.
pub const BOEFJES: [(&str, u64); 7] = [
    ("shodan", 20),
    ("nmap", 20),
    ("dns-records", 15),
    ("ssl-certificates", 15),
    ("webpage-analysis", 10),
    ("security-txt", 10),
    ("wappalyzer", 10),
];

/// The images filtered runners ask for (`BOEFJES_IMAGES`).
pub const FILTERED_IMAGES: [&str; 2] = ["nmap", "dns-records"];

/// Objects per host: several ports of one address, so a `host` concurrency limit binds when an
/// organisation's objects are scanned in order.
pub const OBJECTS_PER_HOST: usize = 10;

/// The crons schedules are drawn from.
const CRONS: [&str; 4] = ["*/30 * * * *", "0 * * * *", "15 * * * *", "45 */2 * * *"];

/// The image of a boefje, as the catalogue and the planner write it.
pub fn image(boefje: &str) -> String {
    format!("ghcr.io/minvws/openkat/{boefje}:latest")
}

/// The reference of an organisation's `j`th object: an `IPPort`, `OBJECTS_PER_HOST` per
/// address.
pub fn object(org: usize, j: usize) -> String {
    let h = j / OBJECTS_PER_HOST;
    format!(
        "IPPort|internet|10.{}.{}.{}|tcp|{}",
        org,
        (h / 256) % 256,
        h % 256,
        8000 + j % OBJECTS_PER_HOST
    )
}

/// The host a `host` limit counts an object reference under (the address of an `IPPort`).
pub fn host_of(reference: &str) -> Option<&str> {
    reference
        .strip_prefix("IPPort|internet|")?
        .split('|')
        .next()
}

/// One push of the day.
#[derive(Clone)]
pub struct Push {
    pub org: usize,
    pub boefje: &'static str,
    pub object: String,
    /// User scans (priority 1) go first; automatic work gets the planner's time-based priority.
    pub user: bool,
}

/// A cron schedule created at the start of the day.
pub struct Schedule {
    pub org: usize,
    pub cron: &'static str,
    pub boefje: &'static str,
}

/// The whole day.
pub struct Day {
    pub orgs: Vec<Org>,
    /// Pushes per simulated minute.
    pub pushes: Vec<Vec<Push>>,
    pub schedules: Vec<Schedule>,
    /// The minute the burst starts, and the minutes it lasts.
    pub burst: (usize, usize),
    /// The minute the service goes down, and for how long.
    pub crash: (usize, usize),
}

fn pick_boefje(rng: &mut Rng) -> &'static str {
    let total: u64 = BOEFJES.iter().map(|(_, w)| w).sum();
    let mut x = rng.next() % total;
    for (b, w) in BOEFJES {
        if x < w {
            return b;
        }
        x -= w;
    }
    BOEFJES[0].0
}

/// Organisations from a spec like `20000,1000x3,50x10` (objects, times how many).
pub fn orgs(spec: &str) -> Result<Vec<Org>, String> {
    let mut sizes = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (size, times) = part.split_once('x').unwrap_or((part, "1"));
        let size: usize = size
            .replace('_', "")
            .parse()
            .map_err(|_| format!("--orgs: {part} is not SIZE or SIZExCOUNT"))?;
        let times: usize = times
            .parse()
            .map_err(|_| format!("--orgs: {part} is not SIZE or SIZExCOUNT"))?;
        sizes.extend(std::iter::repeat_n(size.max(1), times));
    }
    let largest = sizes
        .iter()
        .copied()
        .max()
        .ok_or("--orgs names no organisation")?;
    let mut counts = [0usize; 3];
    Ok(sizes
        .into_iter()
        .map(|objects| {
            // The largest is the one whose burst the day is about; a fiftieth of it is still
            // "medium", below that "small".
            let class = if objects == largest {
                Class::Large
            } else if objects * 50 >= largest {
                Class::Medium
            } else {
                Class::Small
            };
            counts[class as usize] += 1;
            Org {
                name: format!("{}{}", class.name(), counts[class as usize]),
                objects,
                class,
            }
        })
        .collect())
}

/// Draws the day: `minutes` long, from `seed`.
pub fn draw(orgs: Vec<Org>, minutes: usize, seed: u64) -> Day {
    let mut rng = Rng::new(seed);
    let mut pushes: Vec<Vec<Push>> = vec![Vec::new(); minutes];
    // The burst at a quarter of the day (06:00 of a full one), 1,000 objects a minute as a
    // ColdStart pages them; in object order, so each host's objects come together.
    let start = minutes / 4;
    let per_minute = 1_000;
    let mut burst_len = 0;
    for (o, org) in orgs.iter().enumerate() {
        if org.class != Class::Large {
            continue;
        }
        for j in 0..org.objects {
            let m = (start + j / per_minute).min(minutes - 1);
            burst_len = burst_len.max(m + 1 - start);
            pushes[m].push(Push {
                org: o,
                boefje: pick_boefje(&mut rng),
                object: object(o, j),
                user: false,
            });
        }
    }
    // Mutations: 10 × √objects a day per organisation, each 1–2 boefje tasks on one object.
    for (o, org) in orgs.iter().enumerate() {
        let per_minute = 10.0 * (org.objects as f64).sqrt() / 1_440.0;
        for slot in pushes.iter_mut() {
            let mut n = per_minute.floor() as usize;
            if rng.unit() < per_minute.fract() {
                n += 1;
            }
            for _ in 0..n {
                let object = object(o, rng.below(org.objects));
                for _ in 0..1 + rng.below(2) {
                    slot.push(Push {
                        org: o,
                        boefje: pick_boefje(&mut rng),
                        object: object.clone(),
                        user: false,
                    });
                }
            }
        }
    }
    // User scans: about one an hour, anyone's.
    for _ in 0..(minutes / 60).max(1) {
        let o = rng.below(orgs.len());
        let m = rng.below(minutes);
        pushes[m].push(Push {
            org: o,
            boefje: pick_boefje(&mut rng),
            object: object(o, rng.below(orgs[o].objects)),
            user: true,
        });
    }
    let mut schedules = Vec::new();
    for (o, org) in orgs.iter().enumerate() {
        let n = match org.class {
            Class::Large => 6,
            Class::Medium => 3,
            Class::Small => 2,
        };
        // Organisation-wide boefjes (no input object), a different one per schedule (a
        // schedule's hash is its organisation, boefje and object), never shodan: the held
        // counts are of the pushed work.
        let first = rng.below(BOEFJES.len() - 1);
        for k in 0..n {
            schedules.push(Schedule {
                org: o,
                cron: CRONS[rng.below(CRONS.len())],
                boefje: BOEFJES[1 + (first + k) % (BOEFJES.len() - 1)].0,
            });
        }
    }
    Day {
        orgs,
        pushes,
        schedules,
        burst: (start, burst_len),
        // 13:10 of a full day, twelve minutes down: over a quarter past, so fires fall due
        // while nothing ticks.
        crash: (minutes * 13 / 24 + 10, 12),
    }
}
