"""Headless Chromium for the checks that look at a page as a user sees it
(the report page, diff's page, TensorBoard): Debian's chromium with
chromium-driver and python3-selenium, one way for all of them."""

import os

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


class Missing(Exception):
    """What is not installed, and the package that has it."""


def start(profile_dir, size=(1366, 900)):
    """A headless Chromium driver with its window `size` and its profile in
    `profile_dir`; raises Missing naming what to install."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise Missing("needs python3-selenium (apt install python3-selenium chromium-driver)")
    for tool, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.path.exists(tool):
            raise Missing(f"needs {tool}: apt install {package}")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={size[0]},{size[1]}", f"--user-data-dir={profile_dir}"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
