"""The web console in a real headless browser, against real services: what a person sees on
each page, and what the actions do to the scheduler as `lowtide status` reports it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.console.conftest import THRESHOLD, TOKENS, Stack


def wait(browser: WebDriver, condition: Any, within: float = 20.0) -> Any:
    # A live refresh may replace an element between finding it and reading it: looked for again.
    return WebDriverWait(
        browser, within, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    ).until(condition)


def text_of(browser: WebDriver, css: str) -> str:
    return str(browser.find_element(By.CSS_SELECTOR, css).text)


def paused(stack: Stack, queue: str, token: str | None = None) -> bool:
    status = stack.cli("status", "--target", stack.scheduler, token=token)
    return any(q["name"] == queue and q.get("paused", False) for q in status.get("queues", []))


def confirm(browser: WebDriver, button: str) -> None:
    browser.find_element(By.ID, button).click()
    wait(browser, lambda b: b.find_elements(By.ID, "confirm"))
    browser.find_element(By.ID, "confirm").click()


def test_the_overview_draws_the_signal_its_threshold_and_a_planned_release_after_a_set_signal(
    browser: WebDriver, open_stack: Stack, screenshots: Path
) -> None:
    browser.get(open_stack.url + "/")
    wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#signal-chart polyline.signal-line"))
    threshold = browser.find_element(By.CSS_SELECTOR, "#signal-chart line.threshold-line")
    assert f"threshold {THRESHOLD}" in str(threshold.get_attribute("innerHTML"))
    assert f"threshold {THRESHOLD}" in text_of(browser, "#signal-title")
    # The replay's forecast, which the planner plans on, is drawn ahead of now.
    wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#signal-chart polyline.forecast-line"))

    # SetSignal from the page (auth off: the visitor may): the signal goes high, train is held.
    browser.find_element(By.ID, "signal-value").send_keys("400")
    confirm(browser, "set-signal")
    assert "is 400" in wait(browser, lambda b: b.find_element(By.ID, "done-message")).text
    latest = (datetime.now(UTC) + timedelta(hours=6)).isoformat()
    task = open_stack.cli(
        "task",
        "submit",
        "train",
        "--latest-start",
        latest,
        "--estimated-duration",
        "10m",
        "--target",
        open_stack.scheduler,
    )

    browser.get(open_stack.url + "/")
    marker = f'#signal-chart g.planned-release[data-task="{task["id"]}"]'
    wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, marker))
    story = text_of(browser, "#story")
    assert "The signal is HIGH: 400" in story and "1 task(s) have a planned release" in story
    # The live refresh keeps it there (the page is not reloaded).
    refreshed = browser.find_element(By.ID, "live").get_attribute("data-refreshed")
    wait(browser, lambda b: b.find_element(By.ID, "live").get_attribute("data-refreshed") != refreshed)
    assert browser.find_elements(By.CSS_SELECTOR, marker)
    browser.save_screenshot(str(screenshots / "console-overview.png"))

    # The task's page tells its story: held, and when the planner releases it.
    browser.get(f"{open_stack.url}/tasks/{task['id']}")
    assert text_of(browser, "#task-state") == "pending"
    assert "train" in text_of(browser, "#explanation")
    assert "UTC" in text_of(browser, "#planned-release")
    assert browser.find_elements(By.CSS_SELECTOR, f'#plan-chart g.planned-release[data-task="{task["id"]}"]')
    browser.save_screenshot(str(screenshots / "console-task.png"))

    browser.get(open_stack.url + "/tasks?state=pending&type=train")
    assert str(task["id"]) in text_of(browser, "#tasks-table")
    browser.save_screenshot(str(screenshots / "console-tasks.png"))
    # A fixed-start task is a reservation: the pools page draws its window on the timeline.
    fixed = ("task", "submit", "echo", "--start-in", "1h", "--tolerance", "5m", "--estimated-duration", "10m")
    reserved = open_stack.cli(*fixed, "--target", open_stack.scheduler)
    browser.get(open_stack.url + "/pools")
    assert browser.find_elements(By.ID, "pools-table")
    bar = wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#timeline g.reservation"))[0]
    assert f"#{reserved['id']} echo" in bar.text
    # The adaptive type's limit is on the same page: its initial one, as nothing has run it.
    assert text_of(browser, '#adaptive-table tr[data-type="call_api"] td.limit') == "4"
    browser.save_screenshot(str(screenshots / "console-pools.png"))

    # An admin (auth off: anyone on loopback) cancels the held task from its page.
    browser.get(f"{open_stack.url}/tasks/{task['id']}")
    confirm(browser, "cancel")
    assert wait(browser, lambda b: b.find_element(By.ID, "done-message")).text == f"Task {task['id']} is cancelled."
    assert open_stack.cli("task", "get", str(task["id"]), "--target", open_stack.scheduler)["state"] == "cancelled"
    # ... and runs it again from the same page: pending once more.
    browser.get(f"{open_stack.url}/tasks/{task['id']}")
    confirm(browser, "retry")
    assert wait(browser, lambda b: b.find_element(By.ID, "done-message")).text == f"Task {task['id']} is pending."
    assert open_stack.cli("task", "get", str(task["id"]), "--target", open_stack.scheduler)["state"] == "pending"
    # The same retry confirmed again from a tab still showing the cancelled task (its form names
    # the attempt it showed): the task moved on already, so it is said as it is, not refused.
    browser.get(f"{open_stack.url}/tasks/{task['id']}")
    browser.execute_script(
        """const form = document.createElement('form');
        form.method = 'post';
        form.action = '/actions/retry';
        const fields = {csrf: document.querySelector('input[name=csrf]').value, task: arguments[0],
                        attempt: '0', confirm: 'yes'};
        for (const [name, value] of Object.entries(fields)) {
          const input = document.createElement('input');
          input.type = 'hidden'; input.name = name; input.value = value;
          form.appendChild(input);
        }
        document.body.appendChild(form);
        form.submit();""",
        str(task["id"]),
    )
    assert wait(browser, lambda b: b.find_element(By.ID, "done-message")).text == f"Task {task['id']} is pending."


def test_pausing_a_queue_from_the_page_changes_lowtide_status(
    browser: WebDriver, open_stack: Stack, screenshots: Path
) -> None:
    open_stack.cli("task", "submit", "echo", "--target", open_stack.scheduler)
    browser.get(open_stack.url + "/")
    assert not paused(open_stack, "default")
    # With the keyboard alone: Tab from the queue field to Pause, Enter, and Enter again on the
    # confirmation, whose button has the focus.
    browser.find_element(By.ID, "queue").send_keys(Keys.TAB)
    assert browser.switch_to.active_element.get_attribute("id") == "pause"
    browser.switch_to.active_element.send_keys(Keys.ENTER)
    wait(browser, lambda b: b.switch_to.active_element.get_attribute("id") == "confirm")
    browser.switch_to.active_element.send_keys(Keys.ENTER)
    assert "paused" in wait(browser, lambda b: b.find_element(By.ID, "done-message")).text
    assert paused(open_stack, "default")
    browser.get(open_stack.url + "/")
    wait(browser, lambda b: b.find_element(By.CSS_SELECTOR, '[data-queue="default"] .queue-state').text == "paused")
    confirm(browser, "resume")
    assert "running" in wait(browser, lambda b: b.find_element(By.ID, "done-message")).text
    assert not paused(open_stack, "default")

    # On a phone's width nothing runs off the side: wide tables scroll inside their own box.
    size = browser.get_window_size()
    browser.set_window_size(390, 844)
    try:
        for page in ("/", "/pools", "/tasks"):
            browser.get(open_stack.url + page)
            overflow = browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{page} is {overflow}px wider than the phone"
        browser.get(open_stack.url + "/")
        browser.save_screenshot(str(screenshots / "console-phone.png"))
    finally:
        browser.set_window_size(size["width"], size["height"])


def sign_in(browser: WebDriver, stack: Stack, token: str) -> None:
    browser.get(stack.url + "/")
    field = wait(browser, lambda b: b.find_element(By.ID, "token"))
    field.send_keys(token)
    browser.find_element(By.ID, "sign-in").click()


def test_a_viewer_sees_everything_and_cannot_pause(browser: WebDriver, guarded_stack: Stack, screenshots: Path) -> None:
    sign_in(browser, guarded_stack, TOKENS["viewer"])
    wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#signal-chart line.threshold-line"))
    confirm(browser, "pause")
    title = wait(browser, lambda b: b.find_element(By.ID, "problem-title"))
    assert title.text == "The service refused"
    # The scheduler's own words, naming the role and what the call needs.
    message = text_of(browser, "#problem-message")
    assert "PERMISSION_DENIED" in message and "role viewer" in message and "needs admin" in message, message
    browser.save_screenshot(str(screenshots / "console-refused.png"))
    assert not paused(guarded_stack, "default", token=TOKENS["admin"])


def test_an_admin_token_may_pause_with_auth_on(browser: WebDriver, guarded_stack: Stack) -> None:
    sign_in(browser, guarded_stack, TOKENS["admin"])
    wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#signal-chart line.threshold-line"))
    confirm(browser, "pause")
    assert "paused" in wait(browser, lambda b: b.find_element(By.ID, "done-message")).text
    assert paused(guarded_stack, "default", token=TOKENS["admin"])


def test_a_bad_token_gets_a_clear_page(browser: WebDriver, guarded_stack: Stack, screenshots: Path) -> None:
    sign_in(browser, guarded_stack, "not-a-token")
    message = wait(browser, lambda b: b.find_element(By.ID, "login-message")).text
    assert message == "The service did not accept the token: token not accepted"
    browser.save_screenshot(str(screenshots / "console-bad-token.png"))
    # Still not signed in: every page asks for the token again.
    browser.get(guarded_stack.url + "/tasks")
    assert browser.find_elements(By.ID, "token")


def test_bad_input_and_forged_posts_get_clear_pages(browser: WebDriver, open_stack: Stack) -> None:
    for path, expected in (
        ("/tasks/abc", "task id: must be a whole number"),
        ("/tasks/99999999999999999999", "task id: must be a whole number"),
        ("/tasks?state=sleeping", "state: one of pending"),
        ("/tasks?queue=" + "q" * 300, "queue: at most 200 characters"),
        ("/tasks/123456", "NOT_FOUND"),
        ("/nowhere", "is not a page of this console"),
    ):
        browser.get(open_stack.url + path)
        assert expected in text_of(browser, "#problem-message"), path
    # A POST from elsewhere (no session, no CSRF token) is refused and changes nothing.
    forged = httpx.post(open_stack.url + "/actions/pause", data={"queue": "default", "confirm": "yes"})
    assert forged.status_code == 403 and "CSRF" in forged.text
    huge = httpx.post(open_stack.url + "/actions/signal", content=b"value=" + b"9" * 20_000)
    assert huge.status_code == 400 and "at most 16384 bytes" in huge.text
    assert not paused(open_stack, "default")


def test_the_overview_draws_every_other_signal_in_its_unit(browser: WebDriver, open_stack: Stack) -> None:
    signal = open_stack.env["LOWTIDE_SIGNAL_LISTEN"]
    open_stack.cli("signal", "set", "120", "--signal", "price", "--target", signal)
    open_stack.cli("signal", "set", "-4.5", "--signal", "price", "--target", signal)
    browser.get(open_stack.url + "/")
    section = '[data-signal="price"]'
    # The page refreshes itself: each look is made afresh, never on an element it replaced.
    refreshed = WebDriverWait(browser, 20.0, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,))
    refreshed.until(lambda b: b.find_elements(By.CSS_SELECTOR, f"{section} polyline.signal-line"))
    refreshed.until(
        lambda b: "Signal price: -4.5 EUR/MWh, threshold 80" in b.find_element(By.CSS_SELECTOR, f"{section} h2").text
    )
    refreshed.until(
        lambda b: (
            "threshold 80"
            in str(b.find_element(By.CSS_SELECTOR, f"{section} line.threshold-line").get_attribute("innerHTML"))
        )
    )
