"""tau-bench-shaped environments, data and episodes for the performance benchmarks.

Our own code and data, shaped like tau-bench's retail and airline domains (sierra-research/
tau-bench): every piece of state under one attribute, ``self.data``, a dict of tables
(``users``, ``orders``, ``products`` / ``users``, ``flights``, ``reservations``), each a dict
of JSON records keyed by id, megabytes in all; tools read a record or change one record
(or two) in place, as tau-bench's do. Sizes follow the published tau-bench data files
(retail: ~500 users, ~1,500 orders, 50 products with variants; airline: ~500 users, ~2,500
reservations, flights with per-date status), generated deterministically from a seed.

Nothing here runs environment code on the host: :data:`RETAIL_SOURCE` and
:data:`AIRLINE_SOURCE` are text, executed only in sandboxes (or, for the EnvScaler-style
anchor, inside a sandbox through ``/v1/execute``).
"""

from __future__ import annotations

import json
import random
from typing import Any

RETAIL_SOURCE = '''
import copy


class RetailTools:
    """A retail store: users, orders and products, all under self.data."""

    def __init__(self, init_config):
        self.data = init_config.get("data", {})

    def get_user_details(self, user_id: str) -> str:
        """Return a user's profile."""
        user = self.data["users"].get(user_id)
        return str(user) if user else "Error: user not found"

    def get_order_details(self, order_id: str) -> str:
        """Return an order."""
        order = self.data["orders"].get(order_id)
        return str(order) if order else "Error: order not found"

    def cancel_pending_order(self, order_id: str, reason: str) -> str:
        """Cancel a pending order and refund it."""
        order = self.data["orders"].get(order_id)
        if order is None or order["status"] != "pending":
            return "Error: non-pending order cannot be cancelled"
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        order["payment_history"].append({"transaction_type": "refund", "amount": order["total"]})
        return str(order)

    def modify_pending_order_address(self, order_id: str, address: dict) -> str:
        """Change the shipping address of a pending order."""
        order = self.data["orders"].get(order_id)
        if order is None or order["status"] != "pending":
            return "Error: non-pending order cannot be modified"
        order["address"] = dict(address)
        return str(order)

    def modify_user_address(self, user_id: str, address: dict) -> str:
        """Change a user's default address."""
        user = self.data["users"].get(user_id)
        if user is None:
            return "Error: user not found"
        user["address"] = dict(address)
        return str(user)

    def exchange_delivered_order_items(self, order_id: str, item_ids: list, new_item_ids: list) -> str:
        """Exchange delivered items for other variants of the same products."""
        order = self.data["orders"].get(order_id)
        if order is None or order["status"] != "delivered":
            return "Error: non-delivered order cannot be exchanged"
        order["status"] = "exchange requested"
        order["exchange_items"] = sorted(item_ids)
        order["exchange_new_items"] = sorted(new_item_ids)
        return str(order)

    def restock(self, product_id: str, item_id: str, quantity: int) -> str:
        """Mark a product variant available again."""
        variant = self.data["products"][product_id]["variants"][item_id]
        variant["available"] = quantity > 0
        return str(variant)
'''

AIRLINE_SOURCE = '''
class AirlineTools:
    """An airline: users, flights and reservations, all under self.data."""

    def __init__(self, init_config):
        self.data = init_config.get("data", {})

    def get_user_details(self, user_id: str) -> str:
        """Return a user's profile."""
        user = self.data["users"].get(user_id)
        return str(user) if user else "Error: user not found"

    def get_reservation_details(self, reservation_id: str) -> str:
        """Return a reservation."""
        reservation = self.data["reservations"].get(reservation_id)
        return str(reservation) if reservation else "Error: reservation not found"

    def update_reservation_baggages(self, reservation_id: str, total_baggages: int, nonfree_baggages: int) -> str:
        """Change the number of bags of a reservation."""
        reservation = self.data["reservations"][reservation_id]
        reservation["total_baggages"] = total_baggages
        reservation["nonfree_baggages"] = nonfree_baggages
        reservation["payment_history"].append({"amount": 50 * nonfree_baggages})
        return str(reservation)

    def cancel_reservation(self, reservation_id: str) -> str:
        """Cancel a reservation and free its seats."""
        reservation = self.data["reservations"][reservation_id]
        if reservation["status"] == "cancelled":
            return "Error: already cancelled"
        reservation["status"] = "cancelled"
        for leg in reservation["flights"]:
            date = self.data["flights"][leg["flight_number"]]["dates"][leg["date"]]
            date["available_seats"][reservation["cabin"]] += len(reservation["passengers"])
        return str(reservation)

    def book_reservation(self, reservation_id: str, user_id: str, flight_number: str, date: str, cabin: str) -> str:
        """Book one passenger on one flight."""
        day = self.data["flights"][flight_number]["dates"][date]
        if day["available_seats"][cabin] < 1:
            return "Error: no seat"
        day["available_seats"][cabin] -= 1
        self.data["reservations"][reservation_id] = {
            "reservation_id": reservation_id, "user_id": user_id, "cabin": cabin, "status": "active",
            "flights": [{"flight_number": flight_number, "date": date, "price": day["prices"][cabin]}],
            "passengers": [{"first_name": "Pat", "last_name": "Lee"}], "total_baggages": 0,
            "nonfree_baggages": 0, "payment_history": [{"amount": day["prices"][cabin]}]}
        self.data["users"][user_id]["reservations"].append(reservation_id)
        return f"booked {reservation_id}"
'''


def _address(rng: random.Random) -> dict[str, str]:
    return {"address1": f"{rng.randint(1, 999)} {rng.choice(['Oak', 'Elm', 'Pine', 'Main'])} Street",
            "address2": f"Suite {rng.randint(100, 999)}", "city": rng.choice(["Austin", "Denver", "Boston"]),
            "country": "USA", "state": rng.choice(["TX", "CO", "MA"]), "zip": f"{rng.randint(10000, 99999)}"}


def retail_data(seed: int = 7, users: int = 500, orders: int = 1500, products: int = 50) -> dict[str, Any]:
    """Retail tables shaped like tau-bench's (about 1.4 MB of JSON with the defaults)."""
    rng = random.Random(seed)  # noqa: S311 - deterministic test data, not secrets
    product_table = {}
    for p in range(products):
        variants = {f"{p:04d}{v:06d}": {"item_id": f"{p:04d}{v:06d}", "options": {
            "color": rng.choice(["red", "blue", "black", "white"]), "size": rng.choice(["S", "M", "L", "XL"]),
            "material": rng.choice(["cotton", "polyester", "wool"])}, "available": rng.random() > 0.2,
            "price": round(rng.uniform(5, 500), 2)} for v in range(rng.randint(8, 24))}
        product_table[f"P{p:04d}"] = {"name": f"Product {p}", "product_id": f"P{p:04d}", "variants": variants}
    user_table = {f"user_{u:04d}": {"user_id": f"user_{u:04d}", "name": {"first_name": f"First{u}",
                                                                         "last_name": f"Last{u}"},
                                    "address": _address(rng), "email": f"user{u}@example.com",
                                    "payment_methods": {f"card_{u}": {"source": "credit_card", "brand": "visa",
                                                                      "last_four": f"{rng.randint(0, 9999):04d}"}},
                                    "orders": []} for u in range(users)}
    order_table = {}
    items = [(pid, iid) for pid, product in product_table.items() for iid in product["variants"]]
    for o in range(orders):
        user_id = f"user_{rng.randrange(users):04d}"
        chosen = [rng.choice(items) for _ in range(rng.randint(1, 4))]
        lines = [{"name": product_table[pid]["name"], "product_id": pid, "item_id": iid,
                  "price": product_table[pid]["variants"][iid]["price"],
                  "options": product_table[pid]["variants"][iid]["options"]} for pid, iid in chosen]
        total = round(sum(line["price"] for line in lines), 2)
        order_table[f"#W{o:07d}"] = {"order_id": f"#W{o:07d}", "user_id": user_id, "address": _address(rng),
                                     "items": lines, "status": rng.choice(["pending", "delivered", "processed"]),
                                     "fulfillments": [], "total": total,
                                     "payment_history": [{"transaction_type": "payment", "amount": total,
                                                          "payment_method_id": f"card_{user_id[5:]}"}]}
        user_table[user_id]["orders"].append(f"#W{o:07d}")
    return {"users": user_table, "orders": order_table, "products": product_table}


def airline_data(seed: int = 11, users: int = 500, flights: int = 300, days: int = 30,
                 reservations: int = 2500) -> dict[str, Any]:
    """Airline tables shaped like tau-bench's (about 3 MB of JSON with the defaults)."""
    rng = random.Random(seed)  # noqa: S311 - deterministic test data, not secrets
    airports = ["SFO", "JFK", "ORD", "LAX", "SEA", "DFW", "BOS", "MIA", "DEN", "ATL"]
    flight_table = {}
    for f in range(flights):
        origin, destination = rng.sample(airports, 2)
        dates = {f"2024-05-{d + 1:02d}": {"status": "available", "available_seats": {
            "basic_economy": rng.randint(0, 20), "economy": rng.randint(0, 30), "business": rng.randint(0, 10)},
            "prices": {"basic_economy": rng.randint(50, 100), "economy": rng.randint(100, 300),
                       "business": rng.randint(300, 2000)}} for d in range(days)}
        flight_table[f"HAT{f:03d}"] = {"flight_number": f"HAT{f:03d}", "origin": origin, "destination": destination,
                                       "scheduled_departure_time_est": f"{rng.randint(0, 23):02d}:00:00",
                                       "dates": dates}
    user_table = {f"user_{u:04d}": {"user_id": f"user_{u:04d}", "name": {"first_name": f"F{u}", "last_name": f"L{u}"},
                                    "address": _address(rng), "email": f"u{u}@example.com", "dob": "1990-01-01",
                                    "membership": rng.choice(["regular", "silver", "gold"]),
                                    "payment_methods": {f"card_{u}": {"source": "credit_card", "last_four": "1234"}},
                                    "saved_passengers": [{"first_name": "Sam", "last_name": f"L{u}"}],
                                    "reservations": []} for u in range(users)}
    reservation_table = {}
    for r in range(reservations):
        user_id = f"user_{rng.randrange(users):04d}"
        flight = rng.choice(list(flight_table))
        date = f"2024-05-{rng.randint(1, days):02d}"
        cabin = rng.choice(["basic_economy", "economy", "business"])
        price = flight_table[flight]["dates"][date]["prices"][cabin]
        reservation_table[f"R{r:05d}"] = {
            "reservation_id": f"R{r:05d}", "user_id": user_id, "origin": flight_table[flight]["origin"],
            "destination": flight_table[flight]["destination"], "flight_type": "one_way", "cabin": cabin,
            "flights": [{"flight_number": flight, "date": date, "price": price}],
            "passengers": [{"first_name": "Sam", "last_name": "Lee", "dob": "1990-01-01"}],
            "payment_history": [{"payment_id": f"card_{user_id[5:]}", "amount": price}],
            "created_at": "2024-05-01T10:00:00", "total_baggages": rng.randint(0, 2), "nonfree_baggages": 0,
            "insurance": "no", "status": "active"}
        user_table[user_id]["reservations"].append(f"R{r:05d}")
    return {"users": user_table, "flights": flight_table, "reservations": reservation_table}


def retail_episode(data: dict[str, Any], seed: int = 3, steps: int = 30) -> list[dict[str, Any]]:
    """A replayable episode: reads and writing calls, each writing call changing one record."""
    rng = random.Random(seed)  # noqa: S311 - deterministic test data, not secrets
    orders = list(data["orders"])
    users = list(data["users"])
    calls: list[dict[str, Any]] = []
    for _ in range(steps):
        kind = rng.random()
        if kind < 0.3:
            calls.append({"name": "get_order_details", "arguments": {"order_id": rng.choice(orders)}})
        elif kind < 0.5:
            calls.append({"name": "modify_user_address", "arguments": {"user_id": rng.choice(users),
                                                                       "address": _address(rng)}})
        elif kind < 0.7:
            calls.append({"name": "modify_pending_order_address", "arguments": {"order_id": rng.choice(orders),
                                                                                "address": _address(rng)}})
        elif kind < 0.85:
            calls.append({"name": "cancel_pending_order", "arguments": {"order_id": rng.choice(orders),
                                                                        "reason": "no longer needed"}})
        else:
            order = data["orders"][rng.choice(orders)]
            calls.append({"name": "exchange_delivered_order_items", "arguments": {
                "order_id": order["order_id"], "item_ids": [order["items"][0]["item_id"]],
                "new_item_ids": [order["items"][0]["item_id"]]}})
    return calls


def airline_episode(data: dict[str, Any], seed: int = 5, steps: int = 30) -> list[dict[str, Any]]:
    """A replayable airline episode (bookings, bag changes, cancellations, reads)."""
    rng = random.Random(seed)  # noqa: S311 - deterministic test data, not secrets
    reservations = list(data["reservations"])
    users = list(data["users"])
    flights = list(data["flights"])
    calls: list[dict[str, Any]] = []
    for number in range(steps):
        kind = rng.random()
        if kind < 0.3:
            calls.append({"name": "get_reservation_details", "arguments": {"reservation_id": rng.choice(reservations)}})
        elif kind < 0.55:
            calls.append({"name": "update_reservation_baggages", "arguments": {
                "reservation_id": rng.choice(reservations), "total_baggages": 2, "nonfree_baggages": 1}})
        elif kind < 0.75:
            calls.append({"name": "cancel_reservation", "arguments": {"reservation_id": rng.choice(reservations)}})
        else:
            calls.append({"name": "book_reservation", "arguments": {
                "reservation_id": f"N{number:04d}", "user_id": rng.choice(users), "flight_number": rng.choice(flights),
                "date": "2024-05-03", "cabin": "economy"}})
    return calls


DOMAINS = {
    "retail": (RETAIL_SOURCE, "RetailTools", retail_data, retail_episode),
    "airline": (AIRLINE_SOURCE, "AirlineTools", airline_data, airline_episode),
}
"""Domain -> (source, class name, data generator, episode generator)."""


def json_size(value: Any) -> int:
    """Compact JSON size in bytes."""
    return len(json.dumps(value, separators=(",", ":")).encode())
