"""EnvScaler-style environment: an online store's order desk.

Shipped as data for the demo and benchmarks. Sandpit never imports this file on the
host: it is read as text and executed only inside a sandbox.
"""

from typing import Any, Dict, List


class OrderDesk:
    """Customers browse products, fill carts, place and cancel orders.

    Rules: stock never goes negative; an order can only be cancelled while it is
    'placed'; a customer's cart may hold at most 20 distinct products.
    """

    def __init__(self, init_config: dict):
        self.products: Dict[str, Dict[str, Any]] = init_config.get("products", {})
        self.customers: Dict[str, Dict[str, Any]] = init_config.get("customers", {})
        self.carts: Dict[str, Dict[str, int]] = {cid: {} for cid in self.customers}
        self.orders: Dict[str, Dict[str, Any]] = {}
        self._next_order = 1

    def search_products(self, query: str) -> List[Dict[str, Any]]:
        """Return products whose name contains `query` (case-insensitive)."""
        q = query.lower()
        return [dict(p, product_id=pid) for pid, p in sorted(self.products.items()) if q in p["name"].lower()]

    def get_product(self, product_id: str) -> Dict[str, Any]:
        """Return one product's record."""
        if product_id not in self.products:
            raise KeyError(f"no product {product_id}")
        return self.products[product_id]

    def add_to_cart(self, customer_id: str, product_id: str, quantity: int = 1) -> dict:
        """Put `quantity` units of a product in a customer's cart."""
        if customer_id not in self.customers:
            return {"success": False, "error": f"unknown customer {customer_id}"}
        if product_id not in self.products:
            return {"success": False, "error": f"unknown product {product_id}"}
        if quantity <= 0:
            return {"success": False, "error": "quantity must be positive"}
        cart = self.carts[customer_id]
        if product_id not in cart and len(cart) >= 20:
            return {"success": False, "error": "cart is full"}
        cart[product_id] = cart.get(product_id, 0) + quantity
        return {"success": True, "cart": dict(cart)}

    def checkout(self, customer_id: str) -> dict:
        """Turn the customer's cart into an order, reserving stock."""
        cart = self.carts.get(customer_id)
        if not cart:
            return {"success": False, "error": "cart is empty"}
        for pid, qty in cart.items():
            if self.products[pid]["stock"] < qty:
                return {"success": False, "error": f"not enough stock for {pid}"}
        total = 0.0
        for pid, qty in cart.items():
            self.products[pid]["stock"] -= qty
            total += qty * self.products[pid]["price"]
        order_id = f"ORD-{self._next_order:04d}"
        self._next_order += 1
        self.orders[order_id] = {"customer_id": customer_id, "items": dict(cart),
                                 "total": round(total, 2), "status": "placed"}
        self.carts[customer_id] = {}
        return {"success": True, "order_id": order_id, "total": round(total, 2)}

    def cancel_order(self, order_id: str) -> dict:
        """Cancel a placed order and return its stock."""
        order = self.orders.get(order_id)
        if order is None:
            return {"success": False, "error": f"unknown order {order_id}"}
        if order["status"] != "placed":
            return {"success": False, "error": f"order is {order['status']}"}
        for pid, qty in order["items"].items():
            self.products[pid]["stock"] += qty
        order["status"] = "cancelled"
        return {"success": True}
