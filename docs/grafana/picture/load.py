# Load for the dashboard picture: what the platform's clients send, spread over two instances:
# boefje and normalizer pushes (some duplicates, refused 409), runners' pops (boefje runners
# filtered by image) patched running then completed or failed, 3 % abandoned (their leases
# expire), object events and raw files on RabbitMQ with a poison message now and then, and 30
# report schedules due every minute.
# load.py --declare | load.py URL,URL SECONDS
import json, random, sys, threading, time, uuid
import pika, requests

AMQP = "amqp://guest:guest@127.0.0.1:5672/katdash"
QUEUES = ["scan_profile_mutations", "raw_file_received"]

def declare():
    """The queues and their dead-letter queues, before the listeners start."""
    conn = pika.BlockingConnection(pika.URLParameters(AMQP))
    ch = conn.channel()
    for q in QUEUES:
        for name in [q, q + ".dead"]:
            ch.queue_declare(name, durable=True)
    conn.close()

if sys.argv[1] == "--declare":
    declare()
    sys.exit(0)
URLS = sys.argv[1].split(",")
SECONDS = int(sys.argv[2])
ORGS = ["org1", "org2", "org3"]
IMAGES = {"dns-records": "ghcr.io/minvws/openkat/dns-records:latest", "nmap": "ghcr.io/minvws/openkat/nmap:latest"}
stop = time.time() + SECONDS
stats = {"push": 0, "pop": 0, "empty": 0, "patch": 0, "err": 0, "msg": 0}
lock = threading.Lock()

def count(k, n=1):
    with lock:
        stats[k] += n

def url():
    return random.choice(URLS)

def boefje_push(s):
    org = random.choice(ORGS); b = random.choice(list(IMAGES))
    ref = f"Hostname|internet|{org}-u{random.randrange(20000)}.example.com"
    body = {"organisation": org, "priority": random.randint(1, 1000),
            "data": {"boefje": {"id": b, "name": b, "version": None, "oci_image": IMAGES[b]},
                     "input_ooi": ref, "organization": org}}
    return "boefje", body

def normalizer_push(s):
    org = random.choice(ORGS); raw = str(uuid.uuid4())
    body = {"organisation": org, "priority": random.randint(1, 1000),
            "data": {"normalizer": {"id": "kat_dns_normalize"},
                     "raw_data": {"id": raw, "boefje_meta": {"id": str(uuid.uuid4()), "boefje": {"id": "dns-records"},
                                  "organization": org, "input_ooi": f"Hostname|internet|{org}-n.example.com"},
                                  "mime_types": [{"value": "boefje/dns-records"}]}}}
    return "normalizer", body

def pusher(rate, make):
    s = requests.Session()
    while time.time() < stop:
        t0 = time.time()
        sched, body = make(s)
        try:
            r = s.post(f"{url()}/schedulers/{sched}/push", json=body, timeout=10)
            count("push" if r.status_code in (200, 201) else "err")
        except requests.RequestException:
            count("err"); time.sleep(0.5)
        time.sleep(max(0, 1 / rate - (time.time() - t0)))

def runner(sched, image):
    s = requests.Session()
    body = None
    if image:
        body = {"filters": [{"column": "data", "field": "boefje__oci_image", "operator": "in", "value": [image]}]}
    while time.time() < stop:
        try:
            r = s.post(f"{url()}/schedulers/{sched}/pop?limit=1", json=body, timeout=10)
            if r.status_code != 200:
                count("err"); time.sleep(0.5); continue
            tasks = r.json().get("results") or []
            if not tasks:
                count("empty"); time.sleep(0.5); continue
            count("pop")
            t = tasks[0]
            roll = random.random()
            if roll < 0.03:
                continue  # a worker that died: the lease expires
            s.patch(f"{url()}/tasks/{t['id']}", json={"status": "running"}, timeout=10)
            time.sleep(random.uniform(0.05, 0.4))
            end = "failed" if roll < 0.10 else "completed"
            s.patch(f"{url()}/tasks/{t['id']}", json={"status": end}, timeout=10)
            count("patch", 2)
        except requests.RequestException:
            count("err"); time.sleep(0.5)

def publisher():
    conn = pika.BlockingConnection(pika.URLParameters(AMQP))
    ch = conn.channel()
    props = pika.BasicProperties(delivery_mode=2)
    i = 0
    while time.time() < stop:
        org = random.choice(ORGS)
        ref = f"Hostname|internet|{org}-e{random.randrange(3000)}.example.com"
        op = "delete" if i % 40 == 0 else random.choice(["create", "update"])
        value = None if op == "delete" else {"primary_key": ref, "object_type": "Hostname",
                 "scan_profile": {"level": 2, "reference": ref, "scan_profile_type": "declared"}}
        ch.basic_publish("", "scan_profile_mutations",
                         json.dumps({"operation": op, "primary_key": ref, "client_id": org, "value": value}), props)
        if i % 2 == 0:
            raw = {"event_id": "raw_file_received", "organization": org, "raw_data": {
                "id": str(uuid.uuid4()), "boefje_meta": {"id": str(uuid.uuid4()), "organization": org,
                "boefje": {"id": "dns-records"}, "input_ooi": ref}, "mime_types": [{"value": "boefje/dns-records"}]}}
            ch.basic_publish("", "raw_file_received", json.dumps(raw), props)
        if i % 300 == 150:
            ch.basic_publish("", "scan_profile_mutations", b"{not json", props)  # poison: dead-lettered
        count("msg")
        i += 1
        time.sleep(0.06)
    conn.close()

def schedules():
    s = requests.Session()
    for i in range(30):
        org = ORGS[i % 3]
        body = {"scheduler_id": "report", "organisation": org, "schedule": "* * * * *",
                "data": {"organisation_id": org, "report_recipe_id": f"recipe-{i}"}}
        s.post(f"{URLS[0]}/schedules", json=body, timeout=10)

schedules()
threads = [threading.Thread(target=pusher, args=(40, boefje_push)),
           threading.Thread(target=pusher, args=(15, normalizer_push)),
           threading.Thread(target=publisher)]
for b in IMAGES.values():
    for _ in range(3):
        threads.append(threading.Thread(target=runner, args=("boefje", b)))
for _ in range(3):
    threads.append(threading.Thread(target=runner, args=("normalizer", None)))
threads.append(threading.Thread(target=runner, args=("report", None)))
for t in threads:
    t.daemon = True; t.start()
while time.time() < stop:
    time.sleep(30)
    with lock:
        print(time.strftime("%H:%M:%S"), dict(stats), flush=True)
for t in threads:
    t.join(timeout=15)
