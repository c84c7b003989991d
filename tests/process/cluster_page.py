"""The cluster page in a real browser: Debian's headless Chromium, driven by chromedriver through
Debian's python3-selenium.

usage: cluster_page.py CHIEF_URL PS_URL LAUNCHER_PID SCREENSHOT

Loads a ps's page (its own view, linking to the chief's page), then the chief's page and waits
until it shows both workers up, the ps with what it reports of itself (variables, bytes, memory and
the requests/s it serves the workers), a loss curve of two points or more, the newest checkpoint and the job's rate; saves a
screenshot; ends the job (SIGTERM to the
launcher) and waits until the page, still open, says that the chief is unreachable, keeping the
last data it had. Every wait polls the DOM up to a generous deadline: a slow machine makes the test
longer, never wrong. Prints one line per check and exits 1 at the first failure, with the DOM.
"""
import os
import signal
import sys
import time

from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

DEADLINE_SECONDS = 60

chief_url, ps_url, launcher_pid, screenshot = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

options = webdriver.ChromeOptions()
options.binary_location = "/usr/bin/chromium"
for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,1500", "--no-first-run", "--disable-extensions"):
    options.add_argument(argument)
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def fail(what):
    print(f"FAILED: {what}")
    try:
        print(driver.page_source[:20000])
    except WebDriverException:
        pass
    driver.quit()
    sys.exit(1)


def wait_until(what, condition):
    """Polls condition() (a value, or None while not yet) until it holds or the deadline passes."""
    end = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < end:
        try:
            value = condition()
        except WebDriverException:
            value = None
        if value:
            print(f"ok: {what}")
            return value
        time.sleep(0.2)
    fail(f"{what} (not within {DEADLINE_SECONDS} s)")


def attribute(selector, name):
    found = driver.find_elements(By.CSS_SELECTOR, selector)
    return found[0].get_attribute(name) if found else None


try:
    # A ps's own page: its series, no cluster.
    driver.get(ps_url)
    wait_until("the ps's page shows its own view", lambda: attribute("body", "data-view") == "task")
    wait_until("the ps's page lists its metrics",
               lambda: driver.find_elements(By.CSS_SELECTOR, 'tr[data-series="pscoro_ps_variables"]'))
    wait_until("the ps's page names it", lambda: "ps:0" in driver.find_element(By.ID, "title").text)
    # The chief told the ps its page's URL (its port was picked free): the ps's page links there.
    wait_until("the ps's page links to the chief's page", lambda: attribute("#chief-link", "href") == chief_url)

    driver.get(chief_url)
    wait_until("the chief's page is live", lambda: attribute("#status", "data-state") == "live")
    wait_until("the chief's page shows the cluster", lambda: attribute("body", "data-view") == "chief")
    wait_until("both workers are listed, up", lambda: len(
        driver.find_elements(By.CSS_SELECTOR, 'tr[data-worker][data-state="up"]')) == 2)
    workers = sorted(row.get_attribute("data-worker") for row in driver.find_elements(By.CSS_SELECTOR, "tr[data-worker]"))
    if workers != ["worker:0", "worker:1"]:
        fail(f"the workers listed are {workers}")
    wait_until("the ps is listed, holding variables", lambda: [
        row for row in driver.find_elements(By.CSS_SELECTOR, 'tr[data-ps="ps:0"]')
        if row.find_elements(By.TAG_NAME, "td")[2].text not in ("0", "–")])
    headers = [th.text for th in driver.find_elements(By.XPATH, "//tr[@data-ps]/ancestor::table//th")]
    for column in ("variables held", "bytes held", "memory", "requests/s", "chief's requests/s"):
        if column not in headers:
            fail(f"the ps table has no '{column}' column: {headers}")
    print("ok: the ps table has columns for what the ps reports of itself")
    # What the ps reports in its answers to the chief's heartbeats: its variables, bytes and memory,
    # and the requests the workers send it, which the chief never sees.
    def ps_field(name):
        return attribute(f'tr[data-ps="ps:0"] td[data-field="{name}"]', "textContent")
    wait_until("the ps reports the variables it holds, their bytes and its memory", lambda: all(
        ps_field(name) not in (None, "–", "0") for name in ("variables held", "bytes held", "memory")))
    wait_until("the ps serves the workers' requests: its requests/s is above 0",
               lambda: ps_field("requests/s") not in (None, "–") and float(ps_field("requests/s")) > 0)
    wait_until("the loss is a curve of two points or more", lambda: int(
        attribute('figure[data-curve="train/loss"] polyline', "data-points") or 0) >= 2)
    points = attribute('figure[data-curve="train/loss"] polyline', "points")
    if len(points.split()) < 2:
        fail(f"the polyline's points are '{points}'")
    wait_until("the job is running, with a step", lambda: attribute("section[data-job-state]", "data-job-state") == "running")
    wait_until("the workers have finished closures", lambda: any(
        row.find_elements(By.TAG_NAME, "td")[3].text not in ("0", "–")
        for row in driver.find_elements(By.CSS_SELECTOR, "tr[data-worker]")))
    wait_until("the newest checkpoint is shown", lambda: (attribute(
        'dd[data-field="newest"]', "textContent") or "").endswith(".safetensors"))
    # A rate needs two documents a second or more apart: the page's second fetch has one.
    wait_until("the job's steps/s and the time left are shown", lambda: all(
        attribute(f'section[data-job-state] dd[data-field="{field}"]', "textContent") not in (None, "–")
        for field in ("steps/s", "ETA")))
    driver.save_screenshot(screenshot)
    print(f"ok: a screenshot in {screenshot}")

    # The job ends; the page stays open.
    os.kill(launcher_pid, signal.SIGTERM)
    wait_until("the page says that the chief is unreachable",
               lambda: attribute("#status", "data-state") == "unreachable")
    status = driver.find_element(By.ID, "status").text
    if "The chief is unreachable" not in status:
        fail(f"the status says '{status}'")
    if len(driver.find_elements(By.CSS_SELECTOR, "tr[data-worker]")) != 2:
        fail("the last data are gone")
    print("ok: the last data stay")
    driver.save_screenshot(screenshot.replace(".png", "_unreachable.png"))
finally:
    driver.quit()
