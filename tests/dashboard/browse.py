"""An operator's walk through the raftmq dashboard in headless Chromium
(selenium, Debian's chromium and chromium-driver): every page opened, a
topic created through its form and found in the list, a message sent from
the topic page and found by its key, a dead letter resent to its topic, a
consumer group created, and the group's leader killed while the cluster
page is open, which must show a new leader without a reload.

Run by tests/dashboard.rs against `raftmq dev`; a screenshot of each page
goes to --shots. Exits non-zero, saying which step failed, on any failure.
"""

import argparse
import json
import os
import shutil
import signal
import sys
import time

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait


def browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        sys.exit("chromium and chromedriver must be installed (apt-get install chromium chromium-driver)")
    opts = Options()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1400,1000", "--lang=en-US"):
        opts.add_argument(a)
    # The system driver: selenium must not look for one on the internet.
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)


class Walk:
    def __init__(self, d, url, shots):
        self.d, self.url, self.shots = d, url.rstrip("/"), shots
        os.makedirs(shots, exist_ok=True)

    def go(self, path):
        self.d.get(self.url + path)
        self.no_server_error()

    def no_server_error(self):
        body = self.d.find_element(By.TAG_NAME, "body").text
        assert "Internal Server Error" not in body, body[:500]

    def shot(self, name):
        # The whole page, not only the first screenful.
        height = self.d.execute_script("return document.documentElement.scrollHeight")
        self.d.set_window_size(1400, max(1000, min(height + 40, 4000)))
        self.d.save_screenshot(os.path.join(self.shots, f"{name}.png"))
        self.d.set_window_size(1400, 1000)

    def wait(self, what, cond, timeout=20):
        def check(_):
            try:
                return cond()
            except (StaleElementReferenceException, WebDriverException):
                return False
        try:
            return WebDriverWait(self.d, timeout, poll_frequency=0.25).until(check)
        except Exception:
            body = self.d.find_element(By.TAG_NAME, "body").text
            raise AssertionError(f"{what} not seen within {timeout} s; the page says:\n{body[:2000]}")

    def fill(self, css, text):
        el = self.d.find_element(By.CSS_SELECTOR, css)
        el.clear()
        el.send_keys(text)

    def click(self, css):
        self.d.find_element(By.CSS_SELECTOR, css).click()

    def flash_ok(self, contains):
        def ok():
            els = self.d.find_elements(By.ID, "flash-ok")
            errs = self.d.find_elements(By.ID, "flash-error")
            if errs:
                raise AssertionError("the dashboard said: " + errs[0].text)
            return els and contains in els[0].text and els[0].text
        return self.wait(f"'{contains}' confirmed", ok)


def step(name):
    print(f"-- {name}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--dev-json", required=True)
    p.add_argument("--shots", required=True)
    p.add_argument("--dead-topic", required=True)
    p.add_argument("--dead-group", required=True)
    a = p.parse_args()
    dev = json.load(open(a.dev_json))
    d = browser()
    w = Walk(d, a.url, a.shots)
    try:
        step("cluster: every node, one leader")
        w.go("/cluster")
        w.wait("a leader", lambda: d.find_elements(By.CSS_SELECTOR, ".leader-id"))
        rows = d.find_elements(By.CSS_SELECTOR, "tr[data-node]")
        assert len(rows) == len(dev["nodes"]), f"{len(rows)} node rows for {len(dev['nodes'])} nodes"

        step("topics: create one through the form, find it in the list")
        w.go("/topics")
        w.fill("#topic-name", "WebTopic")
        Select(d.find_element(By.CSS_SELECTOR, "#create-topic select[name=message_type]")).select_by_value("NORMAL")
        w.click("#create-topic-submit")
        w.flash_ok("created")
        w.wait("WebTopic in the list", lambda: d.find_elements(By.CSS_SELECTOR, "tr[data-topic=WebTopic]"))
        w.shot("topics")

        step("topic page: send a message with a key")
        d.find_element(By.LINK_TEXT, "WebTopic").click()
        w.fill("#send-keys", "web-key-1")
        w.fill("#send-body", "hello from a real browser")
        w.click("#send-submit")
        sent = w.flash_ok("sent")
        message_id = sent.split()[1]
        w.wait("one message kept", lambda: d.find_element(By.ID, "kept").text == "1")
        w.shot("topic")

        step("messages: find it by its key, open it")
        w.go("/messages")
        w.fill("#search-topic", "WebTopic")
        w.fill("#search-key", "web-key-1")
        w.click("#search-submit")
        w.wait("the message by key", lambda: d.find_elements(By.CSS_SELECTOR, f"tr[data-id='{message_id}']"))
        d.find_element(By.LINK_TEXT, message_id).click()
        w.wait("its body", lambda: "hello from a real browser" in d.find_element(By.ID, "body").text)
        w.shot("message")

        step("dead letters: find the group's, resend it")
        dlq = "%DLQ%" + a.dead_group
        def dead_letters():
            w.go("/messages?" + "topic=%25DLQ%25" + a.dead_group + "&begin=1h")
            return d.find_elements(By.CSS_SELECTOR, "button.resend")
        w.wait(f"a dead letter in {dlq}", dead_letters, timeout=40)
        w.shot("dead-letters")
        d.find_element(By.CSS_SELECTOR, "button.resend").click()
        w.flash_ok("resent")
        w.go("/topic?name=" + a.dead_topic)
        w.wait("the resent copy in " + a.dead_topic, lambda: d.find_element(By.ID, "kept").text == "2")

        step("consumer groups: the dead group listed, a new one created")
        w.go("/groups")
        w.wait(a.dead_group + " listed", lambda: d.find_elements(By.CSS_SELECTOR, f"tr[data-group='{a.dead_group}']"))
        w.fill("#group-name", "WebGroup")
        d.find_element(By.CSS_SELECTOR, "#create-group button").click()
        w.flash_ok("created")
        w.wait("WebGroup listed", lambda: d.find_elements(By.CSS_SELECTOR, "tr[data-group=WebGroup]"))
        w.shot("groups")
        d.find_element(By.LINK_TEXT, a.dead_group).click()
        w.wait("its queues", lambda: d.find_elements(By.CSS_SELECTOR, "#progress tbody tr"))
        w.shot("group")

        step("charts: three drawn")
        w.go("/charts")
        w.wait("three charts", lambda: len(d.find_elements(By.CSS_SELECTOR, ".chart svg")) == 3)
        w.shot("charts")

        step("failover: kill the leader, see the page change by itself")
        w.go("/cluster")
        leader = d.find_element(By.CSS_SELECTOR, ".leader-id")
        group = leader.get_attribute("data-group")
        old = int(leader.text.split()[1])
        w.shot("cluster")
        pid = next(n["pid"] for n in dev["nodes"] if n["group"] == group and n["node_id"] == old)
        os.kill(pid, signal.SIGKILL)
        started = time.time()
        def replaced():
            el = d.find_element(By.CSS_SELECTOR, f".leader-id[data-group='{group}']")
            dead = d.find_element(By.CSS_SELECTOR, f"tr[data-group='{group}'][data-node='{old}']").get_attribute("data-role")
            return int(el.text.split()[1]) != old and dead == "unreachable"
        w.wait("a new leader (without a reload)", replaced, timeout=30)
        print(f"   new leader on screen {time.time() - started:.1f} s after the kill", flush=True)
        w.shot("cluster-failover")
        print("dashboard walk: ok", flush=True)
    finally:
        d.quit()


if __name__ == "__main__":
    main()
